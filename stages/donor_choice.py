"""donor_choice: which checkpoint to graft from, by cheap signals against the measured frontiers (graft.donor_choice).

python -m stages.donor_choice
-> reports/donors/choice.parquet: one row per donor (finetune.donor, labelled "finetune.donor", when finetune.lrs
   has donors.lr, and every donors.candidates entry) and swept epoch at donors.lr: training loss, |D|,
   cos(D, post - base), the predicted per-token retention KL at lam = 1 (diagonal and KFAC Fisher), and the
   measured hypervolume and best point of its lambda frontier (read from reports/points.parquet)
-> reports/donors/summary.json (metrics, under one donor_choice key): per snapshot, each donor's hypervolume, the
   donors ordered by it and each signal's Spearman correlation with it
-> reports/donors/frontiers.png: each donor's lambda path in (new task, old task), post marked
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from graft.atomic import atomic_file, write_json, write_parquet  # noqa: E402
from graft.cli import run_stage  # noqa: E402
from graft.diagnostics import delta_geometry  # noqa: E402
from graft.donor_choice import COLUMNS, epoch_losses, frontier_scores, summary_metrics  # noqa: E402
from graft.kl_prediction import per_token_kl, quadratic_forms  # noqa: E402
from graft.points import POST_DELTA, candidate_delta  # noqa: E402
from graft.registry import DONOR_METHOD  # noqa: E402
from graft.retention_kl import mean_inverse_length, read_rollouts  # noqa: E402
from graft.schema import load_all  # noqa: E402
from graft.sweep import run_tag  # noqa: E402
from graft.tables import read_parquet  # noqa: E402
from graft.tensors import TensorReader  # noqa: E402

FISHER = "tensors/fisher/retention"
OUT = Path("reports/donors")
MAIN = "finetune.donor"   # the sweep's own donor; never a candidate name (those are plain names, without dots)


def donor_runs(p) -> list[dict]:
    """Every donor with where its loss curve, deltas and points are."""
    lr = p["donors"].lr
    runs = [] if lr not in p["finetune"].lrs else [{"donor": MAIN, "model": p["finetune"].donor, "method": "graft",
             "curve": f"reports/finetune/donor_lr{lr}.json",
             "deltas": {ep: f"tensors/delta/graft_{run_tag(lr, ep)}" for ep in p["sweep"].epochs}}]
    runs += [{"donor": name, "model": model, "method": DONOR_METHOD,
              "curve": f"reports/finetune/candidate_{name}.json",
              "deltas": {ep: candidate_delta(name, lr, ep) for ep in p["sweep"].epochs}}
             for name, model in p["donors"].candidates.items()]
    return runs


def lambda_path(points: pd.DataFrame, method: str, model: str, lr: float, epoch: int) -> pd.DataFrame:
    """One donor's unmasked grafts post + lam * D at one snapshot, over every swept lam."""
    mine = points[(points.method == method) & (points.donor == model) & (points.lr == lr) & (points.epoch == epoch)]
    return mine[mine["mask"] == "none"] if method == "graft" else mine


def main() -> None:
    p = load_all()
    lr = p["donors"].lr
    points = read_parquet("reports/points.parquet")
    post = points[points.method == "post"]
    if len(post) != 1:
        raise ValueError(f"reports/points.parquet has {len(post)} post points; run the report stage")
    post_xy = (float(post.new_task.iloc[0]), float(post.old_task.iloc[0]))
    inv_len = mean_inverse_length(read_rollouts())
    rows = []
    with TensorReader(f"{FISHER}/diagonal.safetensors") as fisher, \
            TensorReader(f"{FISHER}/kfac.safetensors") as kfac:
        for run in donor_runs(p):
            losses = epoch_losses(json.loads(Path(run["curve"]).read_text()))
            for ep, delta in run["deltas"].items():
                with TensorReader(delta) as d:
                    forms = quadratic_forms(d, fisher, kfac)
                mine = lambda_path(points, run["method"], run["model"], lr, ep)
                rows.append({"donor": run["donor"], "model": run["model"], "method": run["method"], "lr": lr,
                             "epoch": ep, "delta": delta, "train_loss": losses.get(ep, math.nan),
                             "delta_norm": math.sqrt(forms["sq_norm"]),
                             "cosine_post": delta_geometry(delta, POST_DELTA)["cosine"],
                             "predicted_kl_diagonal": per_token_kl(forms["diagonal_form"], 1.0, inv_len),
                             "predicted_kl_kfac": per_token_kl(forms["kfac_form"], 1.0, inv_len),
                             **frontier_scores(mine, post_xy)})
    table = pd.DataFrame(rows, columns=COLUMNS)
    write_parquet(OUT / "choice.parquet", table)
    write_json(OUT / "summary.json", summary_metrics(table))
    plot(points, table, post_xy, p["donors"].lr)
    print(table.drop(columns=["delta", "model"]).to_string(index=False))


def plot(points: pd.DataFrame, table: pd.DataFrame, post_xy: tuple[float, float], lr: float) -> None:
    fig, ax = plt.subplots(figsize=(7, 5))
    for r in table.itertuples():
        mine = lambda_path(points, r.method, r.model, lr, r.epoch).sort_values("lam")
        ax.plot([post_xy[0], *mine.new_task], [post_xy[1], *mine.old_task], marker="o",
                label=f"{r.donor} ({r.model}) ep{r.epoch}: hypervolume {r.hypervolume:.3f}")
    ax.scatter([post_xy[0]], [post_xy[1]], marker="*", s=200, color="black", zorder=3, label="post")
    ax.set_xlabel("new task")
    ax.set_ylabel("old task")
    ax.set_title("graft from each donor: post -> post + lam * delta")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_file(OUT / "frontiers.png") as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})   # no library version in the bytes
    plt.close(fig)


if __name__ == "__main__":
    run_stage(main)
