"""Pass@k metrics: the unbiased estimator of Chen et al. (2021)."""
from __future__ import annotations

from math import comb
from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n, c of them correct, is correct)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(correct_counts: Sequence[int], n: int, k: int) -> float:
    if not correct_counts:
        raise ValueError("mean_pass_at_k: no problems")
    return sum(pass_at_k(n, c, k) for c in correct_counts) / len(correct_counts)
