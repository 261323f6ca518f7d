"""The whole DAG through `dvc repro` on a small params profile, in a temporary copy of the repo."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO
from tests.small_params import small_params

pytestmark = pytest.mark.slow
COPY = ["graft", "stages", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", "pyproject.toml"]


def run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(cwd))
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r.stdout + r.stderr


def ran_stages(log: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", log))


def set_param(repo: Path, section: str, key: str, value) -> None:
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p[section][key] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("e2e") / "repo"
    d.mkdir()
    for name in COPY:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, d / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, d / name)
    (d / "params.yaml").write_text(small_params((REPO / "params.yaml").read_text()))
    run(["git", "init", "-q"], d)
    run(["git", "config", "user.email", "ci@example.invalid"], d)
    run(["git", "config", "user.name", "ci"], d)
    run(["dvc", "init", "-q"], d)
    run(["dvc", "config", "core.autostage", "true"], d)
    run(["git", "add", "-A"], d)
    run(["git", "commit", "-qm", "small profile"], d)
    return d


def test_full_dag_runs_and_writes_the_report(repo):
    log = run(["dvc", "repro"], repo)
    assert {"world", "mine", "teacher", "synthself", "fisher@retention", "fisher@new", "fisher_share",
            "report"} <= ran_stages(log)
    points = pd.read_parquet(repo / "reports/points.parquet")
    assert set(points.method) == {"post", "sft", "sft_merge", "fisher_merge", "graft", "graft_diagonal",
                                  "graft_kfac", "graft_random"}
    assert len(points) == 2 + 2 + 1 + 2 + 3 * 2
    share = pd.read_parquet(repo / "reports/fisher_share.parquet")
    assert set(share.delta) == {"graft", "sft"} and share.share_of_fisher_weighted_delta.between(0, 1).all()
    assert points.new_task.between(0, 1).all() and points.old_task.between(0, 1).all()
    assert points.frontier.any()
    assert (repo / "reports/pareto.png").stat().st_size > 1000
    samples = pd.read_parquet(repo / "reports/samples/post.parquet")
    assert {"problem_id", "sample", "text", "answer", "correct"} <= set(samples.columns)
    counts = pd.read_parquet(repo / "data/mined/counts.parquet")
    assert {"problem_id", "successes", "kept", "split"} <= set(counts.columns)
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "first run"], repo)


def test_nothing_changed_nothing_runs(repo):
    assert ran_stages(run(["dvc", "repro"], repo)) == set()


def test_new_lambda_runs_only_merge_evaluate_report(repo):
    set_param(repo, "sweep", "lams", [0.5, 0.75])
    ran = ran_stages(run(["dvc", "repro"], repo))
    kinds = ("diagonal", "kfac", "random")
    assert ran == {"merge_graft@0.75", "merge_sft@0.75", "evaluate_graft@0.75", "evaluate_sft_merge@0.75", "report",
                   *[f"merge_graft_mask@{k}-0.75-0.1" for k in kinds],
                   *[f"evaluate_graft_mask@{k}-0.75-0.1" for k in kinds]}
    points = pd.read_parquet(repo / "reports/points.parquet")
    assert sorted(points.lam.dropna().unique()) == [0.5, 0.75]


def test_new_rho_does_not_refinetune_or_reestimate_fisher(repo):
    set_param(repo, "sweep", "rhos", [0.1, 0.2])
    ran = ran_stages(run(["dvc", "repro"], repo))
    assert {"mask@diagonal-0.2", "mask@kfac-0.2", "mask@random-0.2", "report"} <= ran
    assert not ran & {"world", "mine", "teacher", "synthself", "finetune@donor", "finetune@sft", "fisher@retention",
                      "fisher@new", "delta@graft", "delta@sft", "mask@diagonal-0.1", "fisher_share"}
    assert all(s.startswith(("mask@", "merge_graft_mask@", "evaluate_graft_mask@", "report")) for s in ran)
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "sweep"], repo)


def test_dvc_exp_run_and_show(repo):
    run(["dvc", "exp", "run", "-S", "sweep.lams=[0.5]", "-S", "sweep.rhos=[0.1]", "-n", "one-lam"], repo)
    csv = run(["dvc", "exp", "show", "--csv"], repo)
    header = csv.splitlines()[0]
    for col in ("post.new_task", "post.old_task", "graft_lam0.5.new_task", "graft_kfac_lam0.5_rho0.1.old_task",
                "sft_merge_lam0.5.old_task"):
        assert col in header, header
    assert "one-lam" in csv
