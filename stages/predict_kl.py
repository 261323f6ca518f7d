"""predict_kl: the predicted retention KL of every delta a sweep point adds to the post model, before any evaluation.

python -m stages.predict_kl
-> reports/kl/forms.parquet: per delta (graft, each mask at each rho, SFT) 1/2 D^T F D under the diagonal and the
   KFAC retention Fisher (read from the fisher stage's files: no model) and under the full empirical Fisher along D
   (directional: one per-sample-gradient pass of the post model over the Fisher's rollouts per delta), |D|^2, and
   mean_n 1/T_n of the rollouts (graft.kl_prediction). A point post + lam * D is predicted at
   lam^2 form / mean_n 1/T_n nats per token, so a lambda change needs no rerun; no engine is started.
"""
from __future__ import annotations

import pandas as pd
from tqdm import tqdm

from graft.atomic import write_parquet
from graft.chat import open_chat
from graft.cli import run_stage
from graft.openmp import use_threads
from graft.fisher import directional_fisher
from graft.kl_prediction import FORM_COLUMNS, FORMS, quadratic_forms
from graft.modeling import load_model, resolve_device
from graft.points import sweep_deltas
from graft.retention_kl import mean_inverse_length, read_rollouts
from graft.schema import load_all
from graft.tensors import TensorReader

FISHER = "tensors/fisher/retention"


def main() -> None:
    p = load_all()
    models = p["models"]
    rollouts = read_rollouts()
    inv_len = mean_inverse_length(rollouts)
    pad = open_chat(models.post, p["chat"], p["answer"], models.trust_remote_code).pad_id
    use_threads(p["compute"].threads)   # before any torch work (graft.openmp)
    post = load_model(models.post, "float32", models.trust_remote_code, resolve_device(p["compute"].device))
    rows, source_norm = [], {}
    with TensorReader(f"{FISHER}/diagonal.safetensors") as fisher, \
            TensorReader(f"{FISHER}/kfac.safetensors") as kfac:
        for d in tqdm(sweep_deltas(p), desc="predict_kl deltas", mininterval=2.0):
            with TensorReader(d["delta"]) as delta:
                forms = quadratic_forms(delta, fisher, kfac)
                direction = dict(delta.items())
            forms["directional_form"] = directional_fisher(post, rollouts, pad, direction, p["fisher"].chunk) / 2
            del direction
            if d["delta"] == d["source"]:
                source_norm[d["source"]] = forms["sq_norm"]
            rows.append({**{k: d[k] for k in ("family", "delta", "lr", "epoch", "mask", "rho")}, **forms,
                         "source": d["source"], "mean_inverse_length": inv_len})
    for r in rows:   # every source delta comes first in its snapshot's list, so its norm is known
        r["source_sq_norm"] = source_norm[r.pop("source")]
    df = pd.DataFrame(rows, columns=FORM_COLUMNS)
    write_parquet(FORMS, df)
    print(df.drop(columns=["delta"]).to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
