"""report: all points of the current sweep in one table, the Pareto plot, and metrics for ``dvc exp show``.

The propose stage's points (method proposed_<family>) are in the table and drawn as stars; the frontiers are the
sweep's own (proposed and diagnostic points are left out of them).

-> reports/points.parquet, reports/pareto.png, reports/pareto.json (DVC plot data), reports/metrics.json
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from graft.cli import run_stage
from graft.atomic import atomic_file, write_json, write_parquet  # noqa: E402
from graft.pareto import non_dominated  # noqa: E402
from graft.schema import load_all  # noqa: E402
from graft.kl_prediction import PROPOSED  # noqa: E402
from graft.points import proposed_points, sweep_points  # noqa: E402
from graft.registry import DIAGNOSTIC, GRAFT, METHODS, PROPOSED_PREFIX, SFT_MERGE  # noqa: E402
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


def save_figure(fig, axes, path: Path, legend_size: int) -> None:
    """Grid and legend on every axis, then the PNG written atomically."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


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
    save_figure(fig, axes, path, legend_size=7)


def new_task_axis(source: str) -> str:
    """The Pareto plot's x label for a ``finetune.source``."""
    return NEW_TASK_AXIS.get(source, NEW_TASK_AXIS_DEFAULT)


def plot(df: pd.DataFrame, path: Path, x_label: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    several = [c for c in ("lr", "epoch") if df[c].dropna().nunique() > 1]  # name the grid only where it varies
    for method in [m for m in METHODS if m in set(df.method)]:
        sub = df[df.method == method]
        sc = ax.scatter(sub.new_task, sub.old_task, label=method, s=40, alpha=0.85)
        front = sub[non_dominated(list(zip(sub.new_task, sub.old_task)))].sort_values("new_task")
        ax.plot(front.new_task, front.old_task, color=sc.get_facecolor()[0], lw=1)
        for _, r in sub.iterrows():
            marks = [("λ", r.lam), ("ρ", r.rho), ("α", r.alpha)] + [(f"{c} ", getattr(r, c)) for c in several]
            tag = " ".join(f"{sym}{v:g}" for sym, v in marks if not pd.isna(v))
            ax.annotate(tag, (r.new_task, r.old_task), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for method in sorted(m for m in set(df.method) if m.startswith(PROPOSED_PREFIX)):
        sub = df[df.method == method]
        ax.scatter(sub.new_task, sub.old_task, marker="*", s=160, label=method, edgecolors="black", lw=0.6)
        for _, r in sub.iterrows():
            ax.annotate(f"λ{r.lam:g}" + ("" if pd.isna(r.rho) else f" ρ{r.rho:g}"), (r.new_task, r.old_task),
                        fontsize=7, xytext=(3, -9), textcoords="offset points")
    glob = df[df.frontier]
    ax.scatter(glob.new_task, glob.old_task, facecolors="none", edgecolors="black", s=120, lw=1.2,
               label="global frontier")
    ax.set_xlabel(x_label)
    ax.set_ylabel("old task (mean over suites, pass@1)")
    ax.set_title("graft: new vs old task")
    save_figure(fig, [ax], path, legend_size=8)


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
    # plain-text suites are beside the old-task mean, not in it: their perplexities are metrics of their own
    ppl = sorted(c for c in df.columns if c.startswith("old:") and c.endswith("/perplexity"))
    write_json("reports/metrics.json", {
        r["name"]: {"new_task": round(r["new_task"], 6), "old_task": round(r["old_task"], 6),
                    **{c: round(r[c], 6) for c in ppl}} for r in df.to_dict("records")})
    print(df[["name", "new_task", "old_task", "frontier"]].to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
