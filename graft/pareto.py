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


def covers(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]],
           margin: tuple[float, float] = (0.0, 0.0)) -> bool:
    """Every point of ``b`` is weakly dominated by some point of ``a``, allowing ``a`` to fall short by ``margin``."""
    mx, my = margin
    return all(any(p[0] >= q[0] - mx and p[1] >= q[1] - my for p in a) for q in b)


def frontier_dominates(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]],
                       margin: tuple[float, float] = (0.0, 0.0)) -> bool:
    """Does point set ``a`` Pareto-dominate point set ``b``: ``a`` covers ``b`` and ``b`` does not cover ``a`` (so
    equal frontiers do not dominate each other).

    With a ``margin`` (per axis, e.g. two standard errors of the estimates) ``a`` may fall short of ``b`` by the margin
    and still cover it, and must have a point that beats every point of ``b`` by more than the margin on some axis:
    dominance beyond noise."""
    if not a or not b:
        raise ValueError("frontier_dominates: both point sets must be non-empty")
    return covers(a, b, margin) and not covers(b, a, margin)
