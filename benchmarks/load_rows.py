"""Under load: each heavy piece of a stage alone, then beside a second pipeline's stage (a training loop, and a vLLM
engine generating), on SmolLM2-135M. Each is a fresh process (benchmarks.load_work). Measured under each environment
of POLICIES: the stages' own (graft.openmp's 100 spins, vLLM inside the stage's process), libgomp's default wait
(300,000 spins) and vLLM's multiprocess layout, which is what the stages ran with before; the load processes use the
same environment as the measured one, as two pipelines of one version would."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.common import Row, json_line
from benchmarks.sizes import diagonal_fisher, finetuned_and_delta, kfac_file, smollm2
from benchmarks.tensor_rows import REPO, _sandbox

WORKS = {"eig": "KFAC eigendecompositions (3 x 1536 + 6 x 576)", "fisher": "diagonal Fisher, 2 rollouts",
         "train": "finetune step (4 x 96 tokens)", "mask": "mask stage (diagonal), start-up included",
         "generate": "vLLM generation (32 x 64 tokens)"}
LOADS = {"train": "loop-train", "vllm": "loop-generate"}
# name -> the environment that differs; "graft" is what the stages set (graft.openmp, graft.generation)
POLICIES = {"graft": {"GOMP_SPINCOUNT": "100", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            "libgomp default": {"GOMP_SPINCOUNT": "300000", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            "vLLM multiprocess": {"GOMP_SPINCOUNT": "100", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}
DEFAULT_POLICIES = ("graft", "libgomp default")


def _env(policy: dict) -> dict:
    return {**os.environ, **policy, "PYTHONPATH": str(REPO)}


def _describe(policy: dict) -> str:
    return (f"OpenMP {policy['GOMP_SPINCOUNT']} spins; vLLM "
            + ("inside the stage's process" if policy["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" else
               "multiprocess (engine core + pinned worker)"))


# a piece beside a load is stopped after this many times its time alone (at least CAP_MIN_S): beside a vLLM engine a
# second engine was seen to get 1.6% of a core and not finish 32 x 64 tokens in 14 minutes (12.7 s alone); the row
# then says "at least" instead of the suite never ending
CAP, CAP_MIN_S = 10.0, 120.0


def _measure(work: str, model: Path, box: Path | None, env: dict, cap_s: float | None = None) -> tuple[float, bool]:
    """(seconds of the timed piece, finished). Unfinished at ``cap_s`` of the whole process: (cap_s, False), its
    process group killed (a vLLM engine's processes would outlive its parent)."""
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.load_work", work, str(model), str(box or "")], cwd=REPO,
                         env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired:
        _stop(p)
        return cap_s, False
    except BaseException:
        _stop(p)
        raise
    found = json_line(out, "seconds")
    if p.returncode or found is None:
        raise SystemExit(f"load_work {work} failed ({p.returncode}):\n{out[-1000:]}\n{err[-1000:]}")
    return found["seconds"], True


def _start_load(kind: str, model: Path, env: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.load_work", LOADS[kind], str(model)], cwd=REPO,
                         env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    # ready: the model is loaded (and the engine started); the load is running. vLLM logs to stdout too: read up to
    # the ready line, then keep draining so that a full pipe never stalls the load
    for line in p.stdout:
        if json_line(line, "ready"):
            break
    else:
        raise SystemExit(f"the {kind} load did not start")
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    time.sleep(5)
    return p


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, 9)
    except ProcessLookupError:
        pass
    p.wait()
    time.sleep(2)


def load_rows(policies: tuple[str, ...] = DEFAULT_POLICIES, kinds: tuple[str, ...] = tuple(LOADS),
              works: tuple[str, ...] = tuple(WORKS)) -> Iterator[list[Row]]:
    """Each (policy, load) pair's rows as soon as they are measured: a run stopped midway keeps them."""
    size = smollm2()
    box = None
    if "mask" in works:   # the mask piece runs the stage on the suite's inputs
        ft, delta = finetuned_and_delta(size)
        box = _sandbox(size, delta, diagonal_fisher(size, delta), kfac_file(size, delta, None))
    try:
        for policy in policies:
            env = POLICIES[policy]
            alone = {w: _measure(w, size.post, box, env)[0] for w in works}
            for kind in kinds:
                load = _start_load(kind, size.post, env)
                try:
                    beside = {w: _measure(w, size.post, box, env, max(CAP_MIN_S, CAP * alone[w])) for w in works}
                finally:
                    _stop(load)
                yield [Row(f"{WORKS[w]}, beside a second pipeline's {kind} stage", "135m", "the same alone",
                           beside[w][0], alone[w], "<= 2.5x" if policy == "graft" else "",
                           note=f"{policy}: {_describe(env)}" + (
                               "" if beside[w][1] else f"; stopped unfinished after {beside[w][0]:.0f} s of its "
                               "whole process (start-up included): the ratio is the cap's, not a measurement"))
                       for w in works]
    finally:
        if box is not None:
            shutil.rmtree(box, ignore_errors=True)
