"""A two-step chain end to end on the small profile (graft.chain): every step's model is post plus the sum of its
updates, a change to step 2 reruns only step 2's stages, and a step asking a held-out question is refused. Its own
module (and repository), so that the suite's workers share the end-to-end time."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from tests.test_pipeline_e2e import ran_stages, repo, run  # noqa: F401 (repo: the module's own copy of the fixture)

pytestmark = pytest.mark.slow
# a two-step chain on the small profile: the mined skill, then the invented facts (graft.chain)
CHAIN = {"skill": {"after": "post", "source": "teacher", "heldout": {"path": "data/mined/heldout.parquet",
                                                                    "grader": "math"},
                   "lr": 0.001, "epochs": 2, "rho": 0.1, "lam": 1.0},
         "facts": {"after": "skill", "source": "knowledge", "heldout": {"path": "data/knowledge/heldout.parquet",
                                                                       "grader": "fact"},
                   "lr": 0.001, "epochs": 1, "rho": 0.1, "lam": 0.5}}


def tensors_of(path: Path) -> dict[str, torch.Tensor]:
    from graft.tensors import TensorReader

    with TensorReader(path) as r:
        return {n: r.get(n).float() for n in r.names()}


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[n], b[n], rtol=1e-6, atol=1e-7) for n in a)


def test_a_two_step_chain_lands_each_step_on_the_last_and_reruns_only_what_step_two_changed(repo):
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["chain"] = {"steps": CHAIN, "joint": {"lr": 0.001, "epochs": 1}}
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    ran = ran_stages(run(["dvc", "repro", "chain_report@facts"], repo))
    for step in CHAIN:
        assert {f"chain_data@{step}", f"chain_donor@{step}", f"chain_sft@{step}", f"chain_fisher_kfac@{step}",
                f"chain_mask@kfac-{step}", f"chain_merge_graft_kfac@{step}", f"chain_merge_sft_merge@{step}",
                f"chain_joint@{step}", f"chain_evaluate@{step}", f"chain_report@{step}"} <= ran, ran
    # each step's model is the chain's post + sum lam_i M_i(delta_i), computed here from the stored deltas
    post = tensors_of(repo / p["models"]["post"])
    lam = {s: CHAIN[s]["lam"] for s in CHAIN}
    for chain, update in (("graft", "tensors/chain/delta/{}"), ("graft_kfac", "tensors/chain/masked/kfac/{}"),
                          ("graft_diagonal", "tensors/chain/masked/diagonal/{}"),
                          ("graft_random", "tensors/chain/masked/random/{}")):
        u = {s: tensors_of(repo / update.format(s)) for s in CHAIN}
        want = {n: post[n] + lam["skill"] * u["skill"][n] + lam["facts"] * u["facts"][n] for n in post}
        assert close(tensors_of(repo / f"models/chain/{chain}/facts"), want), chain
        state = json.loads((repo / f"models/chain/{chain}/facts.json").read_text())
        assert state["model"] == f"models/chain/{chain}/facts"
    # step two's masks read the Fisher of their own chain's step-one model: two chains, two Fishers
    fd = tensors_of(repo / "tensors/chain/fisher/graft_diagonal/facts/diagonal.safetensors")
    fk = tensors_of(repo / "tensors/chain/fisher/graft_kfac/facts/diagonal.safetensors")
    assert not close(fd, fk)
    # SFT + merge: model_1 + lam_2 (SFT(model_1) - model_1), with model_1 = post + lam_1 (SFT(post) - post)
    ft1, ft2 = (tensors_of(repo / f"models/chain/sft_merge_ft/{s}/epoch{CHAIN[s]['epochs']}") for s in CHAIN)
    m1 = {n: post[n] + lam["skill"] * (ft1[n] - post[n]) for n in post}
    assert close(tensors_of(repo / "models/chain/sft_merge/facts"),
                 {n: m1[n] + lam["facts"] * (ft2[n] - m1[n]) for n in post})
    assert json.loads((repo / "models/chain/sft/facts.json").read_text())["model"] == "models/chain/sft/facts/epoch1"
    # a chain's finetune keeps its last epoch only (a full model each)
    assert sorted(p.name for p in (repo / "models/chain/donor/skill").iterdir()) == ["epoch2"]
    # the report: R per method, BWT after step two, and every method on both tasks and the old suites
    metrics = json.loads((repo / "reports/chain/metrics/facts.json").read_text())["chain"]
    for method in ("graft", "graft_kfac", "graft_diagonal", "graft_random", "sft", "sft_merge", "joint"):
        assert metrics[method]["bwt"] is not None and -1 <= metrics[method]["bwt"] <= 1, method
    matrix = pd.read_parquet(repo / "reports/chain/report/facts/matrix.parquet")
    assert set(matrix.after) == {"post", "skill", "facts"} and set(matrix.task) == {"skill", "facts"}
    points = json.loads((repo / "reports/chain/eval/facts/points.json").read_text())
    assert {"step:skill", "step:facts", "old_task", "kl_post", "kl_previous"} <= set(points["graft_kfac"])
    assert (repo / "reports/chain/report/facts/frontier.png").stat().st_size > 0
    # a new lambda for step two reruns step two's merges and what reads them, never a stage of step one
    before = json.loads(run(["dvc", "status", "--json"], repo))   # earlier tests may leave other stages behind
    p["chain"]["steps"]["facts"]["lam"] = 0.75
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    status = json.loads(run(["dvc", "status", "--json"], repo))
    moved = sorted(k for k in status if status[k] != before.get(k))
    assert moved and all(k.endswith("@facts") for k in moved), moved
    assert not any(k.startswith("chain") and k.endswith("@skill") for k in status), status
    ran = ran_stages(run(["dvc", "repro", "chain_report@facts"], repo))
    assert ran and all(s.endswith("@facts") for s in ran), ran
    assert not any(s.startswith(("chain_donor", "chain_sft", "chain_fisher", "chain_mask")) for s in ran), ran
    # a third step whose traces ask step one's held-out question is refused, naming the row
    heldout = pd.read_parquet(repo / "data/chain/skill/heldout.parquet")
    rows = [{"question": "What is the capital of nowhere?", "think": "", "answer": "none"},
            {"question": heldout.question[0], "think": "", "answer": heldout.answer[0]}]
    (repo / "data/leak.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (repo / "data/leak_heldout.jsonl").write_text(json.dumps({"question": "What is 2 + 2?", "answer": "4"}) + "\n")
    p["data"]["offpolicy"] = {"leak": {"path": "data/leak.jsonl"}}
    p["chain"]["steps"]["more"] = {"after": "facts", "source": "leak", "lr": 0.001, "epochs": 1, "rho": 0.1,
                                   "lam": 1.0, "heldout": {"path": "data/leak_heldout.jsonl", "grader": "math"}}
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    with pytest.raises(AssertionError, match=r"held-out suite of earlier step skill: row 1"):
        run(["dvc", "repro", "chain_data@more"], repo)
    # and one asking an old suite's question
    old = pd.read_parquet(repo / "data/suites/add.parquet")
    rows[1] = {"question": old.question[0], "think": "", "answer": old.answer[0]}
    (repo / "data/leak.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(AssertionError, match=r"ask a question of old suite add: row 1"):
        run(["dvc", "repro", "chain_data@more"], repo)
    del p["chain"]["steps"]["more"]
    p["data"]["offpolicy"] = {}
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
