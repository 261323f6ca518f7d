"""Under load: each heavy piece of a stage alone, then beside a second pipeline's stage (a training loop, and a vLLM
engine generating), on SmolLM2-135M. Each is a fresh process (benchmarks.load_work). Measured twice: with the
stages' OpenMP wait policy (graft.openmp: 100 spins) and with libgomp's own default (300,000 spins), which is what
every stage ran with before; the load processes use the same setting as the measured one, as two pipelines of one
version would."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import Row
from benchmarks.sizes import diagonal_fisher, finetuned_and_delta, kfac_file, smollm2
from benchmarks.tensor_rows import REPO, _sandbox

WORKS = {"eig": "KFAC eigendecompositions (3 x 1536 + 6 x 576)", "fisher": "diagonal Fisher, 2 rollouts",
         "train": "finetune step (4 x 96 tokens)", "mask": "mask stage (diagonal), start-up included",
         "generate": "vLLM generation (32 x 64 tokens)"}
LOADS = {"train": "loop-train", "vllm": "loop-generate"}
POLICIES = {"graft": "100", "libgomp default": "300000"}


def _env(spin: str) -> dict:
    return {**os.environ, "GOMP_SPINCOUNT": spin, "PYTHONPATH": str(REPO)}


def _result(text: str, key: str) -> dict | None:
    """load_work's JSON line: vLLM logs to stdout too, before and after it."""
    for line in reversed(text.splitlines()):
        if line.startswith(f'{{"{key}"'):
            return json.loads(line)
    return None


def _measure(work: str, model: Path, box: Path, spin: str) -> float:
    r = subprocess.run([sys.executable, "-m", "benchmarks.load_work", work, str(model), str(box)], cwd=REPO,
                       env=_env(spin), capture_output=True, text=True)
    found = _result(r.stdout, "seconds")
    if r.returncode or found is None:
        raise SystemExit(f"load_work {work} failed ({r.returncode}):\n{r.stdout[-1000:]}\n{r.stderr[-1000:]}")
    return found["seconds"]


def _start_load(kind: str, model: Path, spin: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.load_work", LOADS[kind], str(model)], cwd=REPO,
                         env=_env(spin), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    # ready: the model is loaded (and the engine started); the load is running. vLLM logs to stdout too: read up to
    # the ready line, then keep draining so that a full pipe never stalls the load
    for line in p.stdout:
        if _result(line, "ready"):
            break
    else:
        raise SystemExit(f"the {kind} load did not start")
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    time.sleep(5)
    return p


def _stop(p: subprocess.Popen) -> None:
    os.killpg(p.pid, 9)
    p.wait()
    time.sleep(2)


def load_rows() -> list[Row]:
    size = smollm2()
    ft, delta = finetuned_and_delta(size)
    box = _sandbox(size, delta, diagonal_fisher(size, delta), kfac_file(size, delta, None))
    rows = []
    try:
        for policy, spin in POLICIES.items():
            alone = {w: _measure(w, size.post, box, spin) for w in WORKS}
            for kind in LOADS:
                load = _start_load(kind, size.post, spin)
                try:
                    beside = {w: _measure(w, size.post, box, spin) for w in WORKS}
                finally:
                    _stop(load)
                for w, what in WORKS.items():
                    rows.append(Row(f"{what}, beside a second pipeline's {kind} stage", "135m", "the same alone",
                                    beside[w], alone[w], "<= 2.5x" if policy == "graft" else "",
                                    note=f"OpenMP: {policy} ({spin} spins)"))
    finally:
        shutil.rmtree(box, ignore_errors=True)
    return rows
