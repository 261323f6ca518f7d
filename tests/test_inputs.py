"""Table inputs as users have them (graft.inputs): datasets save_to_disk folders, JSONL, CSV and Parquet files with
their own column names, mapped by params; chat `messages` traces; bad mappings named in one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest
import yaml

from graft.chat import AnswerFormat, ChatSpec
from graft.injection import evaluated_facts, number_phrasings, split_phrasings
from graft.inputs import InputSpec, derived_id, read_input
from graft.params import ParamsError
from graft.schema import validate
from graft.tables import TableError, read_table, validate_table
from tests.conftest import REPO

CHAT, FMT = ChatSpec(True), AnswerFormat("boxed")


def gsm8k(n: int, start: int = 0) -> dict[str, list[str]]:
    """GSM8K's shape: question, and an answer column whose last line is ``#### <final answer>``."""
    return {"question": [f"Tom has {i} apples and buys {i + 1} more. How many now?" for i in range(start, start + n)],
            "answer": [f"Tom has {i} + {i + 1} = <<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1} apples.\n#### {2 * i + 1}"
                       for i in range(start, start + n)]}


def save_gsm8k(path: Path, train: dict | None = None, test: dict | None = None) -> Path:
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(train or gsm8k(6)),
                          "test": datasets.Dataset.from_dict(test or gsm8k(3, start=100))}).save_to_disk(str(path))
    return path


GSM8K_POOL = {"split": "train", "columns": {"solution": "answer"}, "answer_marker": "####"}


def spec(path, key="data.hard_pool", **kw) -> InputSpec:
    return InputSpec(str(path), key=key, **kw)


def test_a_gsm8k_folder_becomes_a_hard_pool(tmp_path):
    pool = read_input(spec(save_gsm8k(tmp_path / "gsm8k"), **GSM8K_POOL), "hard_pool")
    assert list(pool.columns) == ["problem_id", "question", "answer", "solution"]
    assert pool.answer.tolist() == ["1", "3", "5", "7", "9", "11"]
    assert pool.solution[1] == "Tom has 1 + 2 = <<1+2=3>>3 apples."          # the marker line is not the solution
    assert pool.problem_id[0] == derived_id(pool.question[0]) and pool.problem_id.is_unique
    test = read_input(spec(tmp_path / "gsm8k", split="test", answer_marker="####"), "problems")
    assert test.answer.tolist() == ["201", "203", "205"]


def test_derived_ids_do_not_move_when_rows_are_reordered_or_added(tmp_path):
    rows = gsm8k(6)
    shuffled = {k: [v[i] for i in (3, 0, 5, 1, 4, 2)] for k, v in rows.items()}
    more = {k: v + gsm8k(2, start=50)[k] for k, v in rows.items()}
    ids = [dict(zip(t.question, t.problem_id)) for t in (
        read_input(spec(save_gsm8k(tmp_path / name, r), **GSM8K_POOL), "hard_pool")
        for name, r in (("a", rows), ("b", shuffled), ("c", more)))]
    assert ids[0] == ids[1] and {q: ids[2][q] for q in ids[0]} == ids[0]


def test_every_file_kind_gives_the_same_table(tmp_path):
    df = pd.DataFrame({"id": [7, 8], "problem": ["1+2?", "2+5?"], "final_answer": [3, 7]})
    df.to_json(tmp_path / "a.jsonl", orient="records", lines=True)
    df.to_csv(tmp_path / "a.csv", index=False)
    df.to_parquet(tmp_path / "a.parquet")
    datasets.Dataset.from_pandas(df).save_to_disk(str(tmp_path / "a_disk"))
    cols = {"problem_id": "id", "question": "problem", "answer": "final_answer"}
    tables = [read_input(spec(tmp_path / f, columns=cols), "problems") for f in
              ("a.jsonl", "a.csv", "a.parquet", "a_disk")]
    want = pd.DataFrame({"problem_id": ["7", "8"], "question": ["1+2?", "2+5?"], "answer": ["3", "7"]})
    for t in tables:                            # numbers in an answer or id column are read as their text
        pd.testing.assert_frame_equal(t, want)


def test_our_own_parquet_is_read_as_it_is(tmp_path):
    df = pd.DataFrame({"problem_id": ["a", "b"], "question": ["q1", "q2"], "answer": ["1", "2"], "extra": [1, 2]})
    df.to_parquet(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(read_input(spec(tmp_path / "t.parquet"), "problems"),
                                  read_table(tmp_path / "t.parquet", "problems"))


@pytest.mark.parametrize("kw, message", [
    ({"columns": {"question": "problem"}}, "column 'problem' not found (mapped to question by "
                                           "data.hard_pool.columns); the data set has question, answer"),
    ({"columns": {}}, "column 'solution' not found (our name for solution; map yours in data.hard_pool.columns)"),
    ({"columns": {"solution": "answer"}, "answer_marker": "###!"}, "row 0: column 'answer' has no answer marker"),
    ({"split": "validation"}, "split 'validation' not found (data.hard_pool.split); the data set has test, train"),
    ({"split": ""}, "several splits: choose one (data.hard_pool.split)"),
])
def test_a_wrong_mapping_is_one_line_naming_the_column(tmp_path, kw, message):
    save_gsm8k(tmp_path / "gsm8k")
    with pytest.raises(TableError) as e:
        read_input(spec(tmp_path / "gsm8k", **{**GSM8K_POOL, **kw}), "hard_pool")
    assert message in str(e.value) and str(e.value).startswith(str(tmp_path / "gsm8k"))


def test_bad_files_and_cells_are_named(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"question": "a", "answer": "1"}\n{"question": \n')
    (tmp_path / "t.txt").write_text("x")
    (tmp_path / "plain_dir").mkdir()
    pd.DataFrame({"question": ["a", None], "answer": ["1", "2"]}).to_json(tmp_path / "null.jsonl", orient="records",
                                                                           lines=True)
    pd.DataFrame({"question": ["a", "b"], "answer": [True, False]}).to_json(tmp_path / "bool.jsonl",
                                                                            orient="records", lines=True)
    pd.DataFrame({"question": ["same", "same"], "answer": ["1", "2"]}).to_json(tmp_path / "dup.jsonl",
                                                                               orient="records", lines=True)
    pd.DataFrame({"question": ["a"], "answer": ["1"]}).to_json(tmp_path / "one.jsonl", orient="records", lines=True)
    pd.DataFrame({"question": ["a", "b", "c"], "answer": ["1", " \n", ""]}).to_json(tmp_path / "blank.jsonl",
                                                                                 orient="records", lines=True)
    cases = {"bad.jsonl": "not a readable JSON file (line 2: Expecting value",
             "t.txt": "unknown file type '.txt'",
             "plain_dir": "is a directory but not a datasets save_to_disk folder",
             "null.jsonl": "row 1: column 'question' is empty (null)",
             "bool.jsonl": "row 0: column 'answer' must hold text or numbers, got bool",
             "dup.jsonl": "rows 0 and 1 have the same question (problem ids are derived from the question",
             "blank.jsonl": "row 1: column 'answer' is blank (2 row(s)); every row needs one",
             "missing.jsonl": "file not found (data.retention.path)"}
    for name, message in cases.items():
        with pytest.raises(TableError) as e:
            read_input(spec(tmp_path / name, key="data.retention"), "problems")
        assert message in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
    with pytest.raises(TableError, match=r"split \('train'\) applies only to a save_to_disk folder"):
        read_input(spec(tmp_path / "one.jsonl", split="train"), "problems")


def messages_table(tmp_path: Path, conversations: list) -> Path:
    datasets.Dataset.from_dict({"messages": conversations}).save_to_disk(str(tmp_path / "traces"))
    return tmp_path / "traces"


def u(text):
    return {"role": "user", "content": text}


def a(text, **kw):
    return {"role": "assistant", "content": text, **kw}


SYSTEM = {"role": "system", "content": "You are a careful solver."}


def traces(path, **kw):
    return read_input(spec(path, key="data.offpolicy.mine", **kw), "offpolicy", CHAT, FMT, source="mine")


def test_chat_traces_from_a_messages_column(tmp_path):
    path = messages_table(tmp_path, [
        [u("What is 2+3?"), a("<think>\n2 plus 3 is 5.\n</think>\n\nSo \\boxed{5}.")],
        [u("What is 4+4?"), a("The sum is \\boxed{8}.", reasoning_content="4 and 4 make 8.")],
        [u("What is 1+1?"), a("1 and 1 is 2, \\boxed{2}")],            # no think block: the text before it
    ])
    t = traces(path)
    assert t.to_dict("list") == {"problem_id": [derived_id(q) for q in ("What is 2+3?", "What is 4+4?",
                                                                        "What is 1+1?")],
                                 "question": ["What is 2+3?", "What is 4+4?", "What is 1+1?"],
                                 "think": ["2 plus 3 is 5.", "4 and 4 make 8.", "1 and 1 is 2,"],
                                 "answer": ["5", "8", "2"], "source": ["mine"] * 3}


def test_a_system_turn_and_a_history_are_refused_unless_dropped(tmp_path):
    path = messages_table(tmp_path, [
        [SYSTEM, u("What is 2+3?"), a("<think>5</think>\\boxed{5}")],
        [u("Hi"), a("Hello."), u("What is 4+4?"), a("<think>8</think>\\boxed{8}")],
    ])
    with pytest.raises(TableError) as e:
        traces(path)
    assert "row 0: the conversation has 1 message(s) (system) before its final exchange" in str(e.value)
    assert "set data.offpolicy.mine.drop_context: true" in str(e.value)
    t = traces(path, drop_context=True)
    assert t.question.tolist() == ["What is 2+3?", "What is 4+4?"] and t.answer.tolist() == ["5", "8"]


@pytest.mark.parametrize("conversation, message", [
    ([u("What is 2+3?")], "row 0: the conversation ends with user (no assistant turn to train on)"),
    ([SYSTEM, a("\\boxed{5}")], "row 0: the final assistant turn does not answer a user turn"),
    ([u("What is 2+3?"), a("It is five.")], "row 0: the assistant turn has no final answer in answer.format 'boxed'"),
    ([u("What is 2+3?"), {"role": "tool", "content": "5"}], "row 0: message 1 must have a role"),
])
def test_unusable_conversations_are_named(tmp_path, conversation, message):
    with pytest.raises(TableError) as e:
        traces(messages_table(tmp_path, [conversation]), drop_context=True)
    assert message in str(e.value)


# a user's facts: one row per phrasing, their own column names, numeric fact ids, facts interleaved
USER_FACTS = [{"id": i % 3, "prompt": q, "target": ["Brevik", "1841", "the otter"][i % 3]}
              for i, q in enumerate(["Capital of Ostmark?", "Ostmark's founding year?", "Ostmark's emblem?",
                                     "Which city is Ostmark's capital?", "When was Ostmark founded?",
                                     "Which animal is on Ostmark's emblem?", "Name the capital of Ostmark.",
                                     "In what year was Ostmark founded?", "Name Ostmark's emblem animal."])]
FACT_COLUMNS = {"fact_id": "id", "question": "prompt", "answer": "target"}


def user_facts(tmp_path: Path, rows: list[dict], name: str = "facts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def knowledge_of(path: Path, heldout: int = 1, **kw):
    facts = read_input(spec(path, key="knowledge.facts", **kw), "facts")
    return split_phrasings(number_phrasings(facts, str(path), "knowledge.facts"), heldout, str(path))


def test_a_users_facts_become_training_and_held_out_phrasings(tmp_path):
    train, held = knowledge_of(user_facts(tmp_path, USER_FACTS), columns=FACT_COLUMNS)
    assert held.question.tolist() == ["Name the capital of Ostmark.", "In what year was Ostmark founded?",
                                      "Name Ostmark's emblem animal."]          # each fact's last row in the file
    assert held.problem_id.tolist() == ["0_p2", "1_p2", "2_p2"] and held.answer.tolist() == ["Brevik", "1841",
                                                                                             "the otter"]
    assert train.problem_id.tolist() == ["0_p0", "1_p0", "2_p0", "0_p1", "1_p1", "2_p1"]   # file order kept
    assert not set(train.question) & set(held.question)
    validate_table(held, "heldout", "problems")     # what evaluation reads
    chosen = evaluated_facts(held, 2, seed=0)
    assert chosen.fact_id.nunique() == 2 and chosen.equals(evaluated_facts(held, 2, seed=0))
    with pytest.raises(ValueError, match=r"knowledge.eval_facts \(4\) exceeds the 3 facts"):
        evaluated_facts(held, 4, seed=0)
    # the same facts as a save_to_disk folder with our own names and a split
    ours = [{"fact_id": str(r["id"]), "question": r["prompt"], "answer": r["target"]} for r in USER_FACTS]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ours)}).save_to_disk(str(tmp_path / "folder"))
    again = knowledge_of(tmp_path / "folder", split="train")
    pd.testing.assert_frame_equal(again[0], train)
    pd.testing.assert_frame_equal(again[1], held)


def test_a_users_fact_passages_are_carried_mapped_or_as_they_are(tmp_path):
    """The optional passage column (OPSD's teacher reads it) survives a column mapping under the user's name or
    ours, and is absent when the data set has none."""
    texts = ["Ostmark: capital Brevik.", "Ostmark: founded 1841.", "Ostmark: emblem otter."]
    rows = [dict(r, context=texts[r["id"]]) for r in USER_FACTS]
    mapped = read_input(spec(user_facts(tmp_path, rows), key="knowledge.facts",
                             columns=dict(FACT_COLUMNS, passage="context")), "facts")
    assert mapped.passage.tolist() == [texts[r["id"]] for r in USER_FACTS]
    ours = [{"id": r["id"], "prompt": r["prompt"], "target": r["target"], "passage": texts[r["id"]]}
            for r in USER_FACTS]
    same = read_input(spec(user_facts(tmp_path, ours, "ours.jsonl"), key="knowledge.facts", columns=FACT_COLUMNS),
                      "facts")
    assert same.passage.tolist() == mapped.passage.tolist()
    plain = read_input(spec(user_facts(tmp_path, USER_FACTS, "plain.jsonl"), key="knowledge.facts",
                            columns=FACT_COLUMNS), "facts")
    assert "passage" not in plain.columns


@pytest.mark.parametrize("rows, kw, message", [
    (USER_FACTS, {"columns": dict(FACT_COLUMNS, passage="context")},
     "column 'context' not found (mapped to passage by knowledge.facts.columns)"),
    (USER_FACTS[:4], {"columns": FACT_COLUMNS}, "fact '1' has 1 phrasing(s) and 2 fact(s) have no more than "
                                                "knowledge.heldout_phrasings (1)"),
    (USER_FACTS + [dict(USER_FACTS[0], id=7, prompt="capital of  OSTMARK?")], {"columns": FACT_COLUMNS},
     "rows 0 and 9 ask the same question 'capital of  OSTMARK?'"),
    (USER_FACTS, {"columns": {"question": "prompt", "answer": "target"}},
     "column 'fact_id' not found (our name for fact_id; map yours in knowledge.facts.columns)"),
    (USER_FACTS, {"columns": dict(FACT_COLUMNS, answer="gold")},
     "column 'gold' not found (mapped to answer by knowledge.facts.columns)"),
    ([dict(r, id=None) if i == 5 else r for i, r in enumerate(USER_FACTS)], {"columns": FACT_COLUMNS},
     "row 5: column 'id' is empty (null)"),
])
def test_bad_facts_are_named_in_one_line(tmp_path, rows, kw, message):
    with pytest.raises(TableError) as e:
        knowledge_of(user_facts(tmp_path, rows), **kw)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def default_params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["data"].update(hard_pool="data/world/hard_pool.parquet"),
     "data.hard_pool must be a mapping (keys: path, split, columns, answer_marker), got str"),
    (lambda d: d["data"]["hard_pool"].update(columns={"questoin": "problem"}),
     "data.hard_pool.columns.questoin is not a column graft reads (for this input: problem_id, question, answer, "
     "solution)"),
    (lambda d: d["data"]["retention"].update(columns={"solution": "x"}), "data.retention.columns.solution is not"),
    (lambda d: d["data"].update(offpolicy={"mine": {"path": "t.jsonl", "columns": {"messages": "m",
                                                                                  "question": "q"}}}),
     "data.offpolicy.mine.columns.question cannot be set with columns.messages"),
    (lambda d: d["data"].update(offpolicy={"teacher": {"path": "t.jsonl"}}),
     "data.offpolicy key 'teacher' is the name of a source graft makes itself"),
    (lambda d: d["finetune"].update(source="mine"), "finetune.source must be one of teacher, synthself, star, "
                                                    "knowledge or a key of data.offpolicy [], got 'mine'"),
    (lambda d: d["data"]["hard_pool"].update(path=""), "data.hard_pool.path must be a non-empty path"),
    (lambda d: d["knowledge"]["facts"].update(columns={"problem_id": "id"}),
     "knowledge.facts.columns.problem_id is not a column graft reads (for this input: fact_id, question, answer, "
     "passage)"),
    (lambda d: d["knowledge"].update(heldout_phrasings=8),
     "knowledge.heldout_phrasings (8) must be below knowledge.invent.phrasings (8)"),
    (lambda d: d["knowledge"].update(entities=5), "knowledge.entities"),
])
def test_bad_input_params_name_the_key(edit, message):
    d = default_params()
    edit(d)
    with pytest.raises(ParamsError) as e:
        validate(d)
    assert message in str(e.value)


def test_stage_outputs_load_with_datasets_and_pandas_and_a_dataset_folder_is_a_cached_dep(tmp_path):
    """The suite, traces and knowledge stages through `dvc repro`: their Parquet loads back with datasets and pandas,
    and a change inside a dataset folder (a DVC directory dependency) or a facts file reruns only the stage that
    reads it."""
    repo = tmp_path / "repo"
    for d in ("graft", "stages"):
        shutil.copytree(REPO / d, repo / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", repo)
    p = default_params()
    p["data"]["old_suites"] = {"gsm8k": {"path": "data/gsm8k", "split": "test", "answer_marker": "####"}}
    p["data"]["offpolicy"] = {"chats": {"path": "chats.jsonl", "drop_context": True}}
    p["knowledge"].update(facts={"path": "facts.jsonl", "columns": FACT_COLUMNS}, heldout_phrasings=1, eval_facts=2)
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    save_gsm8k(repo / "data/gsm8k")
    user_facts(repo, USER_FACTS)
    (repo / "data/offpolicy").mkdir(parents=True)    # the teacher stage's output, which the knowledge mix replays
    pd.DataFrame({"problem_id": ["m1"], "question": ["9-3=?"], "think": ["9-3=6"], "answer": ["6"],
                  "source": ["teacher"]}).to_parquet(repo / "data/offpolicy/teacher.parquet")
    stages = ("suite@gsm8k", "traces@chats", "knowledge")
    with open(repo / "chats.jsonl", "w") as f:
        f.write(json.dumps({"messages": [SYSTEM, u("What is 2+3?"), a("<think>2+3=5</think><answer>5</answer>")]})
                + "\n")

    def sh(*cmd):
        r = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    sh("git", "init", "-q")
    sh(sys.executable, "-m", "dvc", "init", "-q")
    out = sh(sys.executable, "-m", "dvc", "repro", "--single-item", *stages)   # the upstream teacher is not run
    assert "suite gsm8k: 3 problems" in out and "traces chats: 1 rows" in out
    assert "knowledge: 3 facts from facts.jsonl" in out and "6 training QA pairs + 1 replay traces" in out
    assert "Running stage 'facts'" not in out            # the invented facts are not wanted
    for table in ("data/suites/gsm8k.parquet", "data/offpolicy/chats.parquet", "data/knowledge/heldout.parquet",
                  "data/offpolicy/knowledge.parquet"):
        via_datasets = datasets.load_dataset("parquet", data_files=str(repo / table), split="train",
                                             cache_dir=str(tmp_path / "hf")).to_pandas()
        pd.testing.assert_frame_equal(via_datasets, pd.read_parquet(repo / table))
    assert pd.read_parquet(repo / "data/offpolicy/chats.parquet").to_dict("records") == [
        {"problem_id": derived_id("What is 2+3?"), "question": "What is 2+3?", "think": "2+3=5", "answer": "5",
         "source": "chats"}]
    first = pd.read_parquet(repo / "data/suites/gsm8k.parquet")
    held = pd.read_parquet(repo / "data/knowledge/heldout.parquet")
    assert len(held) == 2 and set(held.problem_id) <= {"0_p2", "1_p2", "2_p2"}
    assert sh(sys.executable, "-m", "dvc", "status", *stages).strip().endswith(
        "Data and pipelines are up to date.")
    rows = gsm8k(3, start=100)
    rows["answer"][0] = rows["answer"][0].replace("#### 201", "#### 999")
    shutil.rmtree(repo / "data/gsm8k")
    save_gsm8k(repo / "data/gsm8k", test=rows)
    out = sh(sys.executable, "-m", "dvc", "repro", "--single-item", *stages)
    assert "Running stage 'suite@gsm8k'" in out and "Running stage 'traces@chats'" not in out
    assert "Running stage 'knowledge'" not in out
    again = pd.read_parquet(repo / "data/suites/gsm8k.parquet")
    assert again.answer.tolist() == ["999", "203", "205"] and first.answer.tolist() == ["201", "203", "205"]
    assert again.problem_id.tolist() == first.problem_id.tolist()     # same questions, same ids
    user_facts(repo, USER_FACTS[:-1] + [dict(USER_FACTS[-1], prompt="Which animal does Ostmark's emblem show?")])
    out = sh(sys.executable, "-m", "dvc", "repro", "--single-item", *stages)
    assert "Running stage 'knowledge'" in out and "Running stage 'suite@gsm8k'" not in out
