"""The OpenMP wait policy (graft.openmp): set for every stage before torch loads, kept when the user set one, and
never a change in what is computed."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import hashlib, os, stages, torch
g = torch.Generator().manual_seed(0)
a = torch.randn(300, 300, generator=g, dtype=torch.float64)
vals, vecs = torch.linalg.eigh(a @ a.T)
x = torch.randn(64, 256, generator=g)
h = hashlib.sha256()
for t in (vals, vecs, x @ x.T, torch.softmax(x, -1).sum(0), (x.T @ x).logsumexp(0)):
    h.update(t.numpy().tobytes())
print(os.environ["GOMP_SPINCOUNT"], h.hexdigest())
"""


def _probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**clean, **env}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split()


def test_stages_set_a_short_spin_and_keep_the_users_own():
    assert _probe()[0] == "100"
    assert _probe(GOMP_SPINCOUNT="5000")[0] == "5000"


def test_the_wait_policy_never_changes_a_result():
    results = {_probe(GOMP_SPINCOUNT=s)[1] for s in ("0", "100", "30000000")} | {_probe(OMP_WAIT_POLICY="PASSIVE")[1]}
    assert len(results) == 1


def test_compute_threads_sets_torchs_threads_and_zero_keeps_its_default():
    """params.yaml compute.threads reaches torch (graft.openmp.use_threads), in a fresh process so that this test
    process's own threads stay as they are."""
    code = ("import torch; from graft.openmp import use_threads; d = torch.get_num_threads(); use_threads(0); "
            "a = torch.get_num_threads(); use_threads(1); print(d, a, torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    default, after_zero, after_one = (int(x) for x in out.stdout.split())
    assert after_zero == default and after_one == 1


def test_every_stage_that_reads_compute_applies_its_threads():
    """A stage that reads compute.device also sets compute.threads before its torch work (both are the compute
    section, which such a stage declares whole in dvc.yaml)."""
    stages = sorted(p for p in (REPO / "stages").glob("*.py") if '"compute"' in p.read_text())
    assert len(stages) >= 10
    missing = [p.name for p in stages if "use_threads(" not in p.read_text()]
    assert not missing, missing
