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
