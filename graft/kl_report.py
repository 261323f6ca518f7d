"""How good is the predicted retention KL: predicted against measured per point, rank correlations, ratio spreads,
and how the proposed points land against the sweep."""
from __future__ import annotations

import math

import pandas as pd

from graft.kl_prediction import per_token_kl
from graft.registry import DIAGNOSTIC, FISHER_FORMS, PROPOSED_PREFIX, SFT_MERGE


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN below 3 pairs or for a constant side."""
    x, y = pd.Series(list(a), dtype="float64"), pd.Series(list(b), dtype="float64")
    keep = x.notna() & y.notna()
    x, y = x[keep].rank(), y[keep].rank()
    if len(x) < 3 or x.nunique() < 2 or y.nunique() < 2:
        return math.nan
    return float(x.corr(y))


def prediction_table(points: pd.DataFrame, forms: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its measured retention KL and, where the point is post + lam * D for a delta the
    predict_kl stage saw, the predicted per-token KL under each Fisher form (SFT is post + 1 * its delta)."""
    by_delta = {r.delta: r for r in forms.itertuples()}
    sft_delta = {(r.lr, r.epoch): r.delta for r in forms.itertuples() if r.family == SFT_MERGE}
    rows = []
    for r in points.itertuples():
        delta, lam = r.delta, r.lam
        if r.method == "sft":
            delta, lam = sft_delta.get((r.lr, r.epoch)), 1.0
        f = by_delta.get(delta) if isinstance(delta, str) and r.method != DIAGNOSTIC else None
        row = {"name": r.name, "method": r.method, "lam": r.lam, "rho": r.rho, "lr": r.lr, "epoch": r.epoch,
               "new_task": r.new_task, "old_task": r.old_task, "measured_kl": r.retention_kl,
               "measured_kl_rollout": r.retention_kl_rollout}
        for form in FISHER_FORMS:
            row[f"predicted_kl_{form}"] = (per_token_kl(getattr(f, f"{form}_form"), lam, f.mean_inverse_length)
                                           if f is not None else math.nan)
            row[f"ratio_{form}"] = (r.retention_kl / row[f"predicted_kl_{form}"]
                                    if f is not None and row[f"predicted_kl_{form}"] > 0 else math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_summary(table: pd.DataFrame, post_old: float) -> dict:
    """Per Fisher form, over the points with a prediction: how many, the rank correlation of predicted with measured
    KL and of predicted KL with the old-task drop from post, and the spread of measured / predicted."""
    out: dict = {}
    for form in FISHER_FORMS:
        sub = table[table[f"predicted_kl_{form}"].notna() & (table[f"predicted_kl_{form}"] > 0)]
        ratio = sub[f"ratio_{form}"]
        out[form] = {
            "points": int(len(sub)),
            "spearman_predicted_vs_measured": spearman(sub[f"predicted_kl_{form}"], sub.measured_kl),
            "spearman_predicted_vs_old_task_drop": spearman(sub[f"predicted_kl_{form}"], post_old - sub.old_task),
            "ratio_median": float(ratio.median()) if len(sub) else math.nan,
            "ratio_min": float(ratio.min()) if len(sub) else math.nan,
            "ratio_max": float(ratio.max()) if len(sub) else math.nan,
            "ratio_spread": float(ratio.max() / ratio.min()) if len(sub) and ratio.min() > 0 else math.nan,
        }
    measured = table[table.method != DIAGNOSTIC]
    out["measured"] = {"spearman_measured_vs_old_task_drop": spearman(measured.measured_kl,
                                                                      post_old - measured.old_task)}
    return out


def proposal_outcomes(points: pd.DataFrame) -> pd.DataFrame:
    """For every proposed point: the best new-task score any swept point reaches at an old-task score at least the
    proposed point's (over all methods, and over its own family), and how far below it the proposal lands."""
    swept = points[(points.method != DIAGNOSTIC) & ~points.method.str.startswith(PROPOSED_PREFIX)]
    rows = []
    for r in points[points.method.str.startswith(PROPOSED_PREFIX)].itertuples():
        family = r.method[len(PROPOSED_PREFIX):]
        row = {"name": r.name, "family": family, "lam": r.lam, "rho": r.rho, "new_task": r.new_task,
               "old_task": r.old_task, "measured_kl": r.retention_kl}
        for scope, pool in (("all", swept), ("family", swept[swept.method == family])):
            ok = pool[pool.old_task >= r.old_task]
            best = ok.loc[ok.new_task.idxmax()] if len(ok) else None
            row[f"best_{scope}"] = best["name"] if best is not None else None
            row[f"best_{scope}_new_task"] = float(best.new_task) if best is not None else math.nan
            row[f"gap_{scope}"] = float(best.new_task - r.new_task) if best is not None else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["name", "family", "lam", "rho", "new_task", "old_task", "measured_kl",
                                       "best_all", "best_all_new_task", "gap_all", "best_family",
                                       "best_family_new_task", "gap_family"])
