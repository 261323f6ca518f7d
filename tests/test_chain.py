"""Chains (graft.chain): params checks, the continual-learning metrics, and the pieces the chain stages share. The
two-step chain itself runs end to end in tests/test_pipeline_e2e.py."""
from __future__ import annotations

import copy
import json

import pandas as pd
import pytest

from graft.chain import (accuracy_matrix, backward_transfer, final_average, interleave, read_state, retention_groups,
                         shared_questions, write_state)
from graft.hashing import content_hash
from graft.params import ParamsError, read_yaml
from graft.schema import validate
from tests.conftest import REPO

MINED = {"path": "data/mined/heldout.parquet", "grader": "math"}
FACTS = {"path": "data/knowledge/heldout.parquet", "grader": "fact"}


def with_steps(steps: dict) -> dict:
    p = copy.deepcopy(read_yaml(REPO / "params.yaml"))
    p["chain"]["steps"] = steps
    return p


def step(after: str, source: str = "teacher", heldout: dict = MINED, **kw) -> dict:
    return {"after": after, "source": source, "heldout": dict(heldout), "lr": 1e-4, "epochs": 1, "rho": 0.01,
            "lam": 1.0, **kw}


def test_a_chain_of_two_steps_validates():
    p = validate(with_steps({"skill": step("post"), "facts": step("skill", "knowledge", FACTS)}))
    assert list(p["chain"].steps) == ["skill", "facts"]
    assert p["chain"].steps["facts"].heldout.grader == "fact"


@pytest.mark.parametrize("steps, message", [
    ({"skill": step("skill")}, r"chain.steps.skill.after must be 'post' \(the step before it; the first step lands"),
    ({"skill": step("post"), "facts": step("post", "knowledge", FACTS)},
     r"chain.steps.facts.after must be 'skill'"),
    ({"post": step("post")}, r"chain.steps.post: post is the name of the model every chain starts from"),
    ({"skill": step("post"), "again": step("skill", "star")},
     r"chain.steps.again and chain.steps.skill are one task \(both scored on data/mined/heldout.parquet\)"),
    ({"skill": step("post", "mystery")}, r"chain.steps.skill.source must be one of"),
    ({"skill": step("post", heldout={})}, r"chain.steps.skill.heldout: the step's held-out suite is missing"),
    ({"skill": step("post", heldout={"path": "x.parquet", "grader": "perplexity"})},
     r"chain.steps.skill.heldout.grader: a new task is graded by its answers"),
    ({"skill": step("post", heldout={"path": "x.parquet", "graded": "math"})}, r"unknown key chain.steps.skill.heldout"),
    ({"skill": step("post", rho=0.0)}, r"chain.steps.skill.rho must be in \(0, 1\)"),
    ({"a/b": step("post")}, r"chain.steps key 'a/b' must be a plain name"),
    ({"skill": step("post", heldout={"path": "data/world/old_add.parquet"})},
     r"chain.steps.skill.heldout.path is data/world/old_add.parquet, the table of old suite add"),
    ({"skill": step("post", heldout={"path": "x.parquet", "format": "answer_tag"})}, None),
])
def test_bad_chains_are_refused_naming_the_key(steps, message):
    if message is None:   # a control: this one is fine
        validate(with_steps(steps))
        return
    with pytest.raises(ParamsError, match=message):
        validate(with_steps(steps))


def test_a_held_out_format_colliding_with_the_think_markers_is_refused():
    p = with_steps({"skill": step("post", heldout={"path": "x.parquet", "format": "boxed"})})
    p["chat"]["think_markers"] = ["<t>", "}"]   # the main format (answer_tag) is fine with these; boxed is not
    with pytest.raises(ParamsError, match=r"collides with 'boxed' \(chain.steps.skill.heldout.format\)"):
        validate(p)


def test_a_step_name_written_twice_is_refused_as_dvc_would(tmp_path):
    """YAML keeps the last of two equal keys; params.yaml is read as DVC reads it, where a duplicate is an error."""
    text = (REPO / "params.yaml").read_text().replace(
        "  steps: {}", "  steps:\n"
        "    skill: {after: post, source: teacher, heldout: {path: a.parquet}, lr: 0.1, epochs: 1, rho: 0.1, lam: 1}\n"
        "    skill: {after: post, source: star, heldout: {path: b.parquet}, lr: 0.1, epochs: 1, rho: 0.1, lam: 1}\n"
        "   ", 1)
    assert text.count("skill:") == 2
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ParamsError, match=r'not valid YAML.*duplicate key.*skill'):
        read_yaml(tmp_path / "params.yaml")


def test_continual_learning_metrics_by_hand():
    # R[i][j]: post (row 0), after step 1, after step 2; tasks 1 and 2
    scores = {(0, 1): 0.1, (0, 2): 0.0, (1, 1): 0.8, (2, 1): 0.5, (2, 2): 0.9}
    r = accuracy_matrix(scores, 2)
    assert r == [[0.1, 0.0], [0.8, None], [0.5, 0.9]]
    assert backward_transfer(r) == pytest.approx(0.5 - 0.8)
    assert final_average(r) == pytest.approx((0.5 + 0.9) / 2)
    one = accuracy_matrix({(0, 1): 0.1, (1, 1): 0.7}, 1)
    assert backward_transfer(one) is None and final_average(one) == pytest.approx(0.7)
    assert final_average(accuracy_matrix({(2, 1): 0.5}, 2)) is None   # a task of the last row never scored


def test_retention_prompts_take_every_task_in_turn():
    old = pd.DataFrame({"problem_id": ["o0", "o1", "o2"], "question": ["a", "b", "c"], "task": "old"})
    s1 = pd.DataFrame({"problem_id": ["s0"], "question": ["x"], "task": "skill"})
    mixed = interleave([old, s1])
    assert list(mixed.problem_id) == ["o0", "s0", "o1", "o2"]
    assert [list(g.problem_id) for g in retention_groups(mixed)] == [["o0", "o1", "o2"], ["s0"]]


def test_shared_questions_are_found_in_canonical_form():
    train = pd.DataFrame({"problem_id": ["t0", "t1", "t2"], "question": ["What is 2+2?", "WHAT IS 3+3?\u200b", "x"]})
    heldout = pd.DataFrame({"problem_id": ["h0"], "question": ["what is 3+3?"]})
    assert shared_questions(train, heldout) == [(1, "t1")]


def test_a_state_refuses_a_model_whose_bytes_moved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    write_state(tmp_path / "s.json", model, content_hash(model))
    assert read_state(tmp_path / "s.json") == str(model)
    (model / "model.safetensors").write_bytes(b"other")
    with pytest.raises(ValueError, match="no longer holds the weights this state was written with"):
        read_state(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text())["model"] == str(model)
