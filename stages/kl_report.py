"""kl_report: is the predicted retention KL any good, and do proposed points land near the best of the sweep?

python -m stages.kl_report
-> reports/kl/prediction.parquet  per point: measured retention KL, predicted KL (diagonal, KFAC), their ratio
   reports/kl/proposals.parquet   per proposed point: the best swept point at an old-task score at least its own
   reports/kl/prediction.png      predicted vs measured (log axes, one colour per method) and old task vs predicted
   reports/kl/summary.json        rank correlations, ratio spreads, proposal gaps (listed by `dvc exp show`)
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from graft.atomic import write_json, write_parquet  # noqa: E402
from graft.cli import run_stage  # noqa: E402
from graft.figures import legend_outside, method_style, save_png  # noqa: E402
from graft.kl_prediction import FORMS  # noqa: E402
from graft.kl_report import accuracy_summary, prediction_table, proposal_outcomes  # noqa: E402
from graft.registry import DIAGNOSTIC, FISHER_FORMS, method_order  # noqa: E402
from graft.schema import load_all  # noqa: E402
from graft.tables import read_parquet  # noqa: E402

OUT = Path("reports/kl")


def plot(table: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(1, len(FISHER_FORMS) + 1, figsize=(5 * len(FISHER_FORMS) + 5, 4.5), dpi=110)
    have = table[table.predicted_kl_kfac.notna() & (table.measured_kl > 0)]
    every = table[(table.measured_kl > 0) & (table.method != DIAGNOSTIC)]   # every method, predicted or not
    methods = method_order(have.method)
    for ax, form in zip(axes, FISHER_FORMS):
        sub = have[have[f"predicted_kl_{form}"] > 0]
        for m in methods:
            s = sub[sub.method == m]
            ax.scatter(s[f"predicted_kl_{form}"], s.measured_kl, **method_style(m))
        if len(sub):
            lo = min(sub[f"predicted_kl_{form}"].min(), sub.measured_kl.min())
            hi = max(sub[f"predicted_kl_{form}"].max(), sub.measured_kl.max())
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"predicted KL, {form} Fisher (nats/token)")
        ax.set_ylabel("measured retention KL (nats/token)")
        ax.set_title(f"{form}: predicted vs measured (dashed: equal)")
    for m in method_order(every.method):   # the last axis has every method: the figure's one legend reads it
        s = every[every.method == m]
        axes[-1].scatter(s.measured_kl, s.old_task, label=m, **method_style(m))
    if len(every):
        axes[-1].set_xscale("log")
    axes[-1].set_xlabel("measured retention KL (nats/token)")
    axes[-1].set_ylabel("old task (mean over suites, pass@1)")
    axes[-1].set_title("does a KL budget predict forgetting?")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_outside(fig, axes[-1])
    save_png(fig, path)


def rounded(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def main() -> None:
    budget = load_all()["propose"].kl_budget
    points = read_parquet("reports/points.parquet")
    posts = points[points.method == "post"]
    if len(posts) != 1:
        raise ValueError("kl_report: reports/points.parquet must hold exactly one post point")
    table = prediction_table(points, read_parquet(FORMS))
    outcomes = proposal_outcomes(points)
    summary = accuracy_summary(table, float(posts.old_task.iloc[0]))
    write_parquet(OUT / "prediction.parquet", table)
    write_parquet(OUT / "proposals.parquet", outcomes)
    plot(table, OUT / "prediction.png")
    metrics = {form: {k: rounded(v) for k, v in d.items()} for form, d in summary.items()}
    metrics["proposed"] = {"kl_budget": budget, **{
        r.name: {"lam": r.lam, "measured_kl": rounded(r.measured_kl), "within_budget": bool(r.measured_kl <= budget),
                 "new_task": rounded(r.new_task), "old_task": rounded(r.old_task), "gap_all": rounded(r.gap_all),
                 "gap_family": rounded(r.gap_family)} for r in outcomes.itertuples()}}
    write_json(OUT / "summary.json", metrics)
    print(table.drop(columns=["lr", "epoch"]).to_string(index=False))
    print(outcomes.to_string(index=False))
    print(metrics)


if __name__ == "__main__":
    run_stage(main)
