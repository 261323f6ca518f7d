"""chain_report: the chain so far, after one step (graft.chain): accuracy matrices, forgetting, the update geometry.

python -m stages.chain_report --step S  ->  reports/chain/report/S/
    scores.parquet   every model after every step up to S on every task (long: method, after, task, pass@1, ...),
                     the previous step's table and this step's evaluation
    matrix.parquet   R[i][j] per method: after step i (post = 0) on step j's task
    geometry.parquet the update of this step against the previous step's: cosine of the two deltas, and for every
                     masked chain how much of the step's delta its mask removed, in all and along the previous update
    reports/chain/metrics/S.json (DVC metrics): per method: final average accuracy, backward transfer, old-task forgetting (post's old task
                     minus the model's), this step's task, retention KL to post and to the previous model
    frontier.png     this step's task against the old task (and against the earlier tasks' mean), every method
"""
from __future__ import annotations

import json
import math

import pandas as pd

from graft.atomic import atomic_dir, write_json, write_parquet
from graft.chain import (CHAINS, JOINT, REPORTS, ROOT, SCORES, accuracy_matrix, backward_transfer,
                         delta_dir, final_average, masked_dir, params_and_step)
from graft.cli import run_stage
from graft.registry import GRAFT, SWEPT_MASKS, masked_method
from graft.tables import read_parquet
from graft.tensors import TensorReader


def scores_of(step: str, points: dict) -> pd.DataFrame:
    rows = []
    for method, rec in points.items():
        for task, m in rec.items():
            if isinstance(m, dict):
                rows.append({"method": method, "after": step, "task": task, "pass@1": m["pass@1"],
                             "metrics": json.dumps(m, sort_keys=True)})
    return pd.DataFrame(rows, columns=SCORES)


def matrices(scores: pd.DataFrame, steps: list[str]) -> pd.DataFrame:
    """R per method (rows after = post, steps...; columns the steps' tasks), long, with post's row 0 from post's
    score on each task at its own step."""
    tasks = scores[scores.task.str.startswith("step:")].to_dict("records")
    post = {r["task"][5:]: r["pass@1"] for r in tasks if r["method"] == "post"}
    rows = []
    for method in [*CHAINS, JOINT]:
        got = {(r["after"], r["task"][5:]): r["pass@1"] for r in tasks if r["method"] == method}
        for i, after in enumerate([ROOT, *steps]):
            for j, task in enumerate(steps, start=1):
                value = post.get(task) if after == ROOT else got.get((after, task))
                rows.append({"method": method, "row": i, "after": after, "column": j, "task": task,
                             "pass@1": value})
    return pd.DataFrame(rows)


def matrix_of(long: pd.DataFrame, method: str, n: int) -> list[list[float | None]]:
    vals = {(int(r["row"]), int(r["column"])): r["pass@1"] for r in long[long.method == method].to_dict("records")}
    return accuracy_matrix({k: float(v) for k, v in vals.items() if v is not None and not math.isnan(v)}, n)


def geometry(step: str, after: str) -> pd.DataFrame:
    """Step ``step``'s delta against the previous step's (cosine), and each mask's removal from it: the share of
    its squared norm, and of its projection on the previous step's own update of that chain (graft: the previous
    delta; graft_<kind>: the previous masked delta)."""
    if after == ROOT:
        return pd.DataFrame(columns=["chain", "quantity", "value"])
    rows = []
    with TensorReader(delta_dir(step)) as d, TensorReader(delta_dir(after)) as dp:
        masks = {kind: (TensorReader(masked_dir(kind, step)), TensorReader(masked_dir(kind, after)))
                 for kind in SWEPT_MASKS}
        try:
            dot = nd = np_ = 0.0
            acc = {k: {"removed_sq": 0.0, "removed_on_prev": 0.0, "delta_on_prev": 0.0, "prev_sq": 0.0}
                   for k in SWEPT_MASKS}
            for name in d.names():
                x, y = d.get(name).double(), dp.get(name).double()
                dot += float((x * y).sum())
                nd += float((x * x).sum())
                np_ += float((y * y).sum())
                for kind, (m, mp) in masks.items():
                    removed = x - m.get(name).double()
                    u = mp.get(name).double()
                    a = acc[kind]
                    a["removed_sq"] += float((removed * removed).sum())
                    a["removed_on_prev"] += float((removed * u).sum())
                    a["delta_on_prev"] += float((x * u).sum())
                    a["prev_sq"] += float((u * u).sum())
        finally:
            for m, mp in masks.values():
                m.close()
                mp.close()
    cos = dot / math.sqrt(nd * np_) if nd > 0 and np_ > 0 else float("nan")
    rows.append({"chain": GRAFT, "quantity": "cosine(delta, previous delta)", "value": cos})
    for kind, a in acc.items():
        chain = masked_method(kind)
        rows.append({"chain": chain, "quantity": "removed share of |delta|^2", "value": a["removed_sq"] / nd})
        rows.append({"chain": chain, "quantity": "cosine(delta, previous update)",
                     "value": a["delta_on_prev"] / math.sqrt(nd * a["prev_sq"]) if a["prev_sq"] > 0 else float("nan")})
        rows.append({"chain": chain, "quantity": "removed share of delta along previous update",
                     "value": a["removed_on_prev"] / a["delta_on_prev"] if a["delta_on_prev"] else float("nan")})
    return pd.DataFrame(rows)


def frontier(points: dict, step: str, earlier: list[str], path) -> None:
    from graft.figures import legend_outside, method_style, plt, save_png

    panels = 2 if earlier else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), squeeze=False)
    for ax, (label, ys) in zip(axes[0], [("old task (mean of the old suites)", None),
                                         ("earlier steps' tasks (mean)", earlier)][:panels]):
        for method, rec in points.items():
            x = rec.get(f"step:{step}", {}).get("pass@1")
            if ys is None:
                y = rec["old_task"]
            else:
                got = [rec[f"step:{t}"]["pass@1"] for t in ys if f"step:{t}" in rec]
                y = sum(got) / len(got) if len(got) == len(ys) else None
            if x is None or y is None:
                continue
            style = (method_style(method) if method != JOINT else
                     {"color": "#555555", "marker": "*", "s": 90})
            ax.scatter([x], [y], label=method, **style)
        ax.set_xlabel(f"step {step}'s task (pass@1)")
        ax.set_ylabel(label)
        ax.set_xlim(-0.03, 1.03)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].set_title(f"after step {step}: each chain's model")
    legend_outside(fig, axes[0][-1])
    save_png(fig, path)


def main() -> None:
    allp, step = params_and_step()
    points = json.loads((REPORTS / "eval" / step.name / "points.json").read_text())
    prev = read_parquet(REPORTS / "report" / step.after / "scores.parquet")
    scores = pd.concat([prev, scores_of(step.name, points)], ignore_index=True)[SCORES]
    # the steps so far, in order: post is scored on each step's task at that step alone
    steps = [t[5:] for t in scores[(scores.method == "post") & scores.task.str.startswith("step:")].task]
    long = matrices(scores, steps)
    metrics: dict = {"step": step.name, "steps": len(steps)}
    post_old = points["post"]["old_task"]
    for method in [*CHAINS, JOINT]:
        r = matrix_of(long, method, len(steps))
        rec = points[method]
        metrics[method] = {"final_average": final_average(r), "bwt": backward_transfer(r),
                           "new": rec[f"step:{step.name}"]["pass@1"], "old_task": rec["old_task"],
                           "old_forgetting": post_old - rec["old_task"], "kl_post": rec["kl_post"],
                           "kl_previous": rec["kl_previous"]}
    metrics["post"] = {"new": points["post"][f"step:{step.name}"]["pass@1"], "old_task": post_old}
    geo = geometry(step.name, step.after)
    with atomic_dir(REPORTS / "report" / step.name) as tmp:
        write_parquet(tmp / "scores.parquet", scores)
        write_parquet(tmp / "matrix.parquet", long)
        write_parquet(tmp / "geometry.parquet", geo)
        frontier(points, step.name, steps[:-1], tmp / "frontier.png")
    write_json(REPORTS / "metrics" / f"{step.name}.json", {"chain": metrics})
    for method in [*CHAINS, JOINT]:
        m = metrics[method]
        bwt = "-" if m["bwt"] is None else f"{m['bwt']:+.3f}"
        print(f"chain {step.name} {method:15s} new {m['new']:.3f} old {m['old_task']:.3f} "
              f"final avg {m['final_average']:.3f} bwt {bwt} kl {m['kl_post']:.3g}")


if __name__ == "__main__":
    run_stage(main)
