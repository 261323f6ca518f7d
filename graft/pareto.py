"""Pareto frontier of (new-task, old-task) points: both higher is better."""
from __future__ import annotations

from typing import Sequence


def non_dominated(points: Sequence[tuple[float, float]]) -> list[bool]:
    """True where no other point is >= on both axes and > on one."""
    out = []
    for i, (x, y) in enumerate(points):
        dominated = any((a >= x and b >= y) and (a > x or b > y) for j, (a, b) in enumerate(points) if j != i)
        out.append(not dominated)
    return out


def weakly_dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] >= b[0] and a[1] >= b[1]


def frontier_dominates(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    """Does point set ``a`` Pareto-dominate point set ``b``: every point of ``b`` is weakly dominated by a point of
    ``a``, and some point of ``b`` is strictly dominated (>= on both, > on one). Equal sets do not dominate."""
    if not a or not b:
        raise ValueError("frontier_dominates: both point sets must be non-empty")
    covered = all(any(weakly_dominates(p, q) for p in a) for q in b)
    strict = any(any(weakly_dominates(p, q) and p != q for p in a) for q in b)
    return covered and strict
