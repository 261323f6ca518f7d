"""report: all points of the current sweep in one table, the Pareto plot, and metrics for ``dvc exp show``.

The propose stage's points (method proposed_<family>) are in the table and drawn as stars; the frontiers are the
sweep's own (proposed and diagnostic points are left out of them).

-> reports/points.parquet, reports/pareto.png, reports/pareto.json (DVC plot data), reports/metrics.json,
   reports/headline.json (one point per method: the columns `dvc exp show` leads with)
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from graft.cli import run_stage
from graft.atomic import write_json, write_parquet  # noqa: E402
from graft.headline import headline  # noqa: E402
from graft.figures import legend_outside, method_style, save_png  # noqa: E402
from graft.pareto import non_dominated  # noqa: E402
from graft.schema import load_all  # noqa: E402
from graft.kl_prediction import PROPOSED  # noqa: E402
from graft.points import proposed_points, sweep_points  # noqa: E402
from graft.registry import DIAGNOSTIC, GRAFT, PROPOSED_PREFIX, SFT_MERGE, method_order  # noqa: E402
from graft.tables import read_parquet  # noqa: E402

# what the x axis measures: evaluate scores knowledge recall greedily, every other source by pass@1 over n samples
NEW_TASK_AXIS = {"knowledge": "new task (held-out phrasings of injected facts, greedy exact match)"}
NEW_TASK_AXIS_DEFAULT = "new task (held-out mined problems, pass@1)"



def load_points(names: list[str], folder: Path) -> pd.DataFrame:
    """One row per point: its coordinates in the grid, the new task, each old suite, the old mean, pass@k."""
    rows = []
    for name in names:
        path = folder / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(f"report: point {name} has no {path}; run the evaluate stage")
        d = json.loads(path.read_text())
        row = {k: d.get(k) for k in ("name", "method", "donor", "delta", "lr", "epoch", "lam", "rho", "mask",
                                     "alpha")}
        row.update(new_task=d["new_task"], old_task=d["old_task"], generated_tokens=d.get("generated_tokens"))
        for key in ("retention_kl", "retention_kl_rollout"):
            if key not in d:
                raise ValueError(f"report: point {name} has no {key} in {path}; run the evaluate stage")
            row[key] = d[key]
        for key, val in d.items():
            if key.startswith("old:") or key == "new":
                for metric, v in val.items():
                    row[f"{key}/{metric}"] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    df["frontier"] = False  # globally non-dominated among the swept methods (diagnostics, proposals excluded)
    methods = (df.method != DIAGNOSTIC) & ~df.method.str.startswith(PROPOSED_PREFIX)
    df.loc[methods, "frontier"] = non_dominated(list(zip(df.new_task[methods], df.old_task[methods])))
    df["method_frontier"] = False  # non-dominated among the points of its own method
    for _, idx in df.groupby("method").groups.items():
        sub = df.loc[idx]
        df.loc[idx, "method_frontier"] = non_dominated(list(zip(sub.new_task, sub.old_task)))
    return df


def save_figure(fig, axes, path: Path) -> None:
    """Grid on every axis, the last axis's legend outside the axes, then the PNG written atomically."""
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_outside(fig, axes[-1], fontsize=7)
    save_png(fig, path)


def plot_paths(df: pd.DataFrame, path: Path) -> None:
    """Accuracy along base -> post (t) and along post -> post + lam * delta for the graft and SFT deltas of each
    finetune snapshot: smooth curves mean the world is in the regime where weight arithmetic is meaningful."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120, sharey=True)
    post = df[df.method == "post"].iloc[0]
    base_path = df[df.method == DIAGNOSTIC].sort_values("lam")
    ts = list(base_path.lam) + [1.0]
    for col, style in (("old_task", "-o"), ("new_task", "--s")):
        axes[0].plot(ts, list(base_path[col]) + [post[col]], style, label=col.replace("_", " "))
    axes[0].set_xlabel("t in base + t (post - base)")
    axes[0].set_ylabel("pass@1")
    # the figure is a declared output, so it is drawn even when diagnostics.interpolation asks for no points
    axes[0].set_title("post-training path" if len(base_path) else "post-training path (no interpolation points)")
    for method in (GRAFT, SFT_MERGE):
        for (lr, ep), sub in df[df.method == method].groupby(["lr", "epoch"]):
            sub = sub.sort_values("lam")
            lams = [0.0] + list(sub.lam)
            for col, style in (("old_task", "-o"), ("new_task", "--s")):
                axes[1].plot(lams, [post[col]] + list(sub[col]), style,
                             label=f"{method} lr{lr:g} ep{ep:g}: {col.replace('_', ' ')}")
    axes[1].set_xlabel("lam in post + lam * delta (unmasked)")
    axes[1].set_title("update paths")
    axes[0].legend(fontsize=7)
    save_figure(fig, axes, path)


def new_task_axis(source: str) -> str:
    """The Pareto plot's x label for a ``finetune.source``."""
    return NEW_TASK_AXIS.get(source, NEW_TASK_AXIS_DEFAULT)


def point_tag(r, several: list[str]) -> str:
    """A point's coordinates in the grid: lambda, rho, alpha, and lr / epoch where the sweep varies them."""
    marks = [("λ", r.lam), ("ρ", r.rho), ("α", r.alpha)] + [(f"{c} ", getattr(r, c)) for c in several]
    return " ".join(f"{sym}{v:g}" for sym, v in marks if not pd.isna(v))


def plot(df: pd.DataFrame, path: Path, x_label: str) -> None:
    """New vs old task: each method's points joined in lambda order (one line per rho, snapshot, alpha and donor),
    post marked with its levels as reference lines, the global frontier circled and numbered, and a table beside
    the plot naming each numbered point (labels on the points themselves overlap)."""
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    several = [c for c in ("lr", "epoch") if df[c].dropna().nunique() > 1]  # name the grid only where it varies
    post = df[df.method == "post"]
    for r in post.itertuples():
        ax.axhline(r.old_task, color="black", lw=0.7, ls=":", zorder=0)
        ax.axvline(r.new_task, color="black", lw=0.7, ls=":", zorder=0)
    for method in method_order(df.method):
        sub = df[df.method == method]
        style = method_style(method)
        ax.scatter(sub.new_task, sub.old_task, label=method, alpha=0.9, zorder=6 if method == "post" else 3, **style)
        if method.startswith(PROPOSED_PREFIX) or len(sub) < 2:
            continue
        for _, line in sub.groupby(["rho", "lr", "epoch", "alpha", "donor"], dropna=False):
            line = line.sort_values("lam")
            if len(line) > 1:
                ax.plot(line.new_task, line.old_task, color=style["color"], lw=1, alpha=0.7, zorder=2)
    front = df[df.frontier].sort_values("new_task")
    ax.scatter(front.new_task, front.old_task, facecolors="none", edgecolors="black", s=150, lw=1.1, zorder=4,
               label="global frontier (numbered)")
    rows, at = [], {}
    for i, r in enumerate(front.itertuples(), 1):
        at.setdefault((r.new_task, r.old_task), []).append(str(i))   # equal points share one label: "8,9"
        rows.append(f"{i:>2}  {r.method} {point_tag(r, several)}  new {r.new_task:.3f}  old {r.old_task:.3f}")
    for xy, numbers in at.items():
        ax.annotate(",".join(numbers), xy, fontsize=7, xytext=(5, 4), textcoords="offset points", zorder=5)
    ax.set_xlabel(x_label)
    ax.set_ylabel("old task (mean over suites, pass@1)")
    ax.set_title("graft: new vs old task (dotted: post)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_outside(fig, ax)
    if rows:
        fig.text(1.0, 0.02, "global frontier\n" + "\n".join(rows), fontsize=7, family="monospace",
                 va="bottom", ha="left")
    save_png(fig, path)


def draw_figures(df: pd.DataFrame, source: str, reports: Path) -> None:
    """Both figures the stage declares, whatever the sweep: a run with `diagnostics.interpolation: []` has no
    base_to_post points and still gets its interpolation figure (DVC fails a stage that leaves an output unwritten)."""
    plot(df[df.method != DIAGNOSTIC], reports / "pareto.png", new_task_axis(source))
    plot_paths(df, reports / "diagnostics/interpolation.png")


def main() -> None:
    allp = load_all()
    points = sweep_points(allp) + proposed_points(allp, read_parquet(PROPOSED))
    df = load_points([pt.name for pt in points], Path("reports/points"))
    write_parquet("reports/points.parquet", df)
    draw_figures(df, allp["finetune"].source, Path("reports"))
    # DVC plot data for .dvc/plots/pareto.json (Vega-Lite): one record per point
    write_json("reports/pareto.json", [
        {"method": r.method, "name": r.name, "new_task": r.new_task, "old_task": r.old_task,
         "frontier": bool(r.frontier), "method_frontier": bool(r.method_frontier)} for r in df.itertuples()
        if r.method != DIAGNOSTIC])
    write_json("reports/headline.json", {"headline": headline(df)})   # listed first by `dvc exp show`
    # plain-text suites are beside the old-task mean, not in it: their perplexities are metrics of their own
    ppl = sorted(c for c in df.columns if c.startswith("old:") and c.endswith("/perplexity"))
    write_json("reports/metrics.json", {
        r["name"]: {"new_task": round(r["new_task"], 6), "old_task": round(r["old_task"], 6),
                    **{c: round(r[c], 6) for c in ppl}} for r in df.to_dict("records")})
    print(df[["name", "new_task", "old_task", "frontier"]].to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
