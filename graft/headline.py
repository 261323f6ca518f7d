"""The headline `dvc exp show` leads with: one point per method, so experiments compare at a glance.

A method's headline point is its point with the highest mean of new and old task (ties: the lower retention KL,
then the name): the best balance the sweep found for it, read off the evaluation, so it is a summary of a sweep and
never how a result is chosen (the propose stage's points, chosen from the predicted KL alone, are listed beside it
as proposed_<family>)."""
from __future__ import annotations

import pandas as pd

from graft.registry import DIAGNOSTIC, method_order

FIELDS = ("new_task", "old_task", "retention_kl")


def headline(points: pd.DataFrame) -> dict[str, dict]:
    """{method: {point, new_task, old_task, retention_kl}} from the report's points table, in registry order."""
    rows = points[points.method != DIAGNOSTIC].assign(balance=lambda d: (d.new_task + d.old_task) / 2)
    out = {}
    for method in method_order(rows.method):
        sub = rows[rows.method == method].sort_values(["balance", "retention_kl", "name"],
                                                       ascending=[False, True, True])
        best = sub.iloc[0]
        out[method] = {"point": str(best["name"]), **{f: round(float(best[f]), 6) for f in FIELDS}}
    return out
