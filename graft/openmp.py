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
