"""Donor choice (paper 5.3, its open problem of choosing the pretraining checkpoint): cheap signals of each donor's
graft delta, read before any evaluation, against the frontier its grafts measure.

Per donor and swept snapshot (the table ``stages.donor_choice`` writes):
  train_loss      the mean finetune loss over that epoch's steps (how well the donor learned the new data)
  delta_norm      |D|
  cosine_post     cos(D, post - base): does the donor's update point along what post-training changed
  predicted_kl_*  the quadratic estimate 1/2 D^T F D of the retention KL at lam = 1, per token (graft.kl_prediction),
                  under the diagonal and the KFAC retention Fisher of the post model
measured:
  hypervolume     the area the donor's points (post + lam * D over sweep.lams, and post itself) dominate in
                  (new task, old task) above (0, 0): one number for a whole lambda frontier
  best_new_task   the best new-task score over its lambdas, and that point's old-task score
Across donors at one snapshot, each signal's Spearman correlation with the hypervolume says whether it ranks the
donors as their measured frontiers do (sign included: a low predicted KL should mean a large hypervolume).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import pandas as pd

SIGNALS = ("train_loss", "delta_norm", "cosine_post", "predicted_kl_diagonal", "predicted_kl_kfac")
COLUMNS = ["donor", "model", "method", "lr", "epoch", "delta", *SIGNALS, "hypervolume", "best_new_task",
           "old_task_at_best", "n_points"]


def hypervolume(points: Iterable[tuple[float, float]], ref: tuple[float, float] = (0.0, 0.0)) -> float:
    """Area of the region dominated by ``points`` (both coordinates maximised) and bounded below by ``ref``."""
    kept = sorted(((x, y) for x, y in points if x > ref[0] and y > ref[1]), key=lambda p: (-p[0], -p[1]))
    area, top = 0.0, ref[1]
    for x, y in kept:   # by decreasing x: each point adds the strip above the best y seen so far
        if y > top:
            area += (x - ref[0]) * (y - top)
            top = y
    return area


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on tie-averaged ranks); None when it is undefined (fewer than two
    pairs, a NaN, or a constant side)."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} values against {len(y)}")
    if len(x) < 2 or any(v != v for v in (*x, *y)):
        return None
    rx, ry = _ranks(list(x)), _ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def epoch_losses(curve: Sequence[dict]) -> dict[int, float]:
    """The mean training loss of each epoch of a finetune's loss curve (records with epoch and loss)."""
    sums: dict[int, list[float]] = {}
    for r in curve:
        sums.setdefault(int(r["epoch"]), []).append(float(r["loss"]))
    return {e: sum(v) / len(v) for e, v in sums.items()}


def frontier_scores(points: pd.DataFrame, post: tuple[float, float]) -> dict[str, float]:
    """The measured side of one donor at one snapshot: ``points`` holds its lambda points (new_task, old_task)."""
    xy = [(float(a), float(b)) for a, b in zip(points.new_task, points.old_task)]
    best = points.loc[points.new_task.idxmax()] if len(points) else None
    # no evaluated point: nothing measured (NaN), not an empty frontier
    return {"hypervolume": hypervolume([*xy, post]) if xy else float("nan"), "n_points": len(points),
            "best_new_task": float(best.new_task) if best is not None else float("nan"),
            "old_task_at_best": float(best.old_task) if best is not None else float("nan")}


def rank_agreement(table: pd.DataFrame) -> list[dict]:
    """Per snapshot (lr, epoch) with two or more donors: each signal's Spearman correlation with the hypervolume."""
    out = []
    for (lr, epoch), sub in table.groupby(["lr", "epoch"], sort=True):
        if len(sub) < 2:
            continue
        row = {"lr": float(lr), "epoch": int(epoch), "donors": list(sub.donor),
               "order_by_hypervolume": list(sub.sort_values("hypervolume", ascending=False).donor)}
        row.update({f"spearman_{s}": spearman(list(sub[s]), list(sub.hypervolume)) for s in SIGNALS})
        out.append(row)
    return out


def summary_metrics(table: pd.DataFrame) -> dict:
    """The table as the metrics ``dvc exp show`` lists, under one ``donor_choice`` key so that no name collides
    with another metrics file's (DVC prefixes a colliding name with its file, which hides it from a user's column
    filter): per snapshot ``lr<lr>_ep<epoch>``, each donor's hypervolume, and where two or more donors were
    measured, the order they rank in and each signal's Spearman correlation with the hypervolume."""
    agreement = {(r["lr"], r["epoch"]): r for r in rank_agreement(table)}
    out: dict[str, dict] = {}
    for (lr, epoch), sub in table.groupby(["lr", "epoch"], sort=True):
        # a donor with no evaluated point has no hypervolume: null, not NaN (which is not JSON)
        snap: dict = {"hypervolume": {d: None if h != h else float(h) for d, h in zip(sub.donor, sub.hypervolume)}}
        row = agreement.get((float(lr), int(epoch)))
        if row is not None:
            snap["order_by_hypervolume"] = " > ".join(row["order_by_hypervolume"])
            snap["spearman"] = {s: row[f"spearman_{s}"] for s in SIGNALS}
        out[f"lr{float(lr)}_ep{int(epoch)}"] = snap
    return {"donor_choice": out}
