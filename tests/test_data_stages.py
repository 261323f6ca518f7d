import pandas as pd
import pytest

from graft.generation import Completion
from graft.offpolicy import accept_rewrites, teacher_traces
from graft.tables import TableError, read_table
from stages.mine import MiningError, split_mined
from tests.conftest import family_grader


def _pool(n):
    return pd.DataFrame({"problem_id": [f"p{i}" for i in range(n)], "suite": "sub",
                         "question": [f"{i}-1=?" for i in range(n)], "answer": [str(i - 1) for i in range(n)],
                         "solution": ["..."] * n})


def test_mined_split_is_disjoint_and_keeps_only_hard():
    pool = _pool(20)
    successes = [0, 3] * 10
    train, held, counts = split_mined(pool, successes, max_successes=1, heldout=4, seed=0)
    assert set(train.problem_id).isdisjoint(held.problem_id)
    assert len(held) == 4 and len(train) == 6
    kept = set(counts.loc[counts.successes <= 1, "problem_id"])
    assert set(train.problem_id) | set(held.problem_id) == kept
    assert (counts.split == "dropped").sum() == 10


def test_empty_mined_set_is_a_clear_error():
    with pytest.raises(MiningError, match="mining kept 0 problems"):
        split_mined(_pool(5), [4] * 5, max_successes=0, heldout=2, seed=0)


def test_synthself_drops_mismatches_and_never_substitutes_gold():
    train = _pool(3)
    rewrites = ["<think>\nmine\n</think>\n\n<answer>-1</answer>",    # p0: gold -1, correct
                "<think>\nwrong\n</think>\n\n<answer>7</answer>",    # p1: gold 0, wrong
                "<answer>1</answer>"]                                # p2: no think block closed
    out = accept_rewrites(train, [Completion(t, ()) for t in rewrites], family_grader())
    assert out.accepted.tolist() == [True, False, False]
    assert out.think[0] == "mine"


def test_teacher_traces_schema():
    t = teacher_traces(_pool(2))
    assert list(t.columns) == ["problem_id", "question", "think", "answer", "source"]


def test_table_errors_name_the_problem(tmp_path):
    df = _pool(2).drop(columns=["solution"])
    df.to_parquet(tmp_path / "a.parquet")
    with pytest.raises(TableError, match="missing column 'solution'"):
        read_table(tmp_path / "a.parquet", "hard_pool")
    (tmp_path / "b.parquet").write_bytes(b"garbage")
    with pytest.raises(TableError, match="not a readable Parquet"):
        read_table(tmp_path / "b.parquet", "hard_pool")
    pd.concat([_pool(2), _pool(1)]).to_parquet(tmp_path / "c.parquet")
    with pytest.raises(TableError, match="duplicate problem_id 'p0'"):
        read_table(tmp_path / "c.parquet", "hard_pool")
    _pool(0).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(TableError, match="empty"):
        read_table(tmp_path / "d.parquet", "hard_pool")
