"""How idle OpenMP threads wait, set before torch loads its OpenMP runtime.

torch's CPU kernels and its LAPACK (MKL, GNU threading layer) run on libgomp, whose idle threads spin 300,000 times
at every barrier before they sleep. Beside another busy process on the same cores, a spinning thread burns the time
slice its partner needs, and barrier-heavy work slows far more than sharing explains: measured here (2 cores), the
KFAC eigendecompositions of SmolLM2-sized factors took 2.2-2.8 s alone and 65-87 s beside one training process
(30-40x); with 100 spins, 4.5 s beside it (about 2x) and 2.4-2.8 s alone. The spin count changes how threads wait,
never what they compute, so it comes from the environment: a value the user set is kept.
"""
from __future__ import annotations

import os

SPINCOUNT = "100"


def wait_politely() -> None:
    """Give libgomp a short spin before sleeping, unless the environment already says otherwise. Must run before
    torch is imported (libgomp reads its environment once, when it is loaded); child processes inherit it."""
    os.environ.setdefault("GOMP_SPINCOUNT", SPINCOUNT)


def use_threads(threads: int) -> None:
    """params.yaml ``compute.threads``: torch's CPU threads in this process (0 keeps torch's default, one per core).
    Call it before any torch work and before a vLLM engine opens (an engine in this process uses torch's threads).

    Why it exists: every CPU kernel is a fork-join region that ends when its slowest thread is done, and beside other
    busy processes a thread is often not scheduled. Token-by-token sampling of SmolLM2-135M (4 rows x 96 tokens,
    ~210 small kernels a token) took 9.3 s alone on one or two threads, and beside another pipeline and a test run
    13.7 s on one thread but 181-188 s on two (BENCHMARKS.md, 2026-12-05). Two pipelines on C cores should each
    have C / 2. Why it is a param and not the environment: torch splits a full reduction between its threads, so the
    count changes sums at round-off (gradient-norm clipping, the Fisher's and the masks' statistics), and DVC must
    see it to cache exactly."""
    if threads:
        import torch

        torch.set_num_threads(threads)
