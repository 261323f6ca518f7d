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
