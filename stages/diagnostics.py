"""diagnostics: is the world in the paper's regime, and how do the updates relate?

python -m stages.diagnostics
-> reports/diagnostics/weights.parquet  per tensor: ||post - base|| / ||base||
   reports/diagnostics/deltas.parquet   per finetune snapshot: ||graft delta|| and ||SFT delta|| relative to
                                        ||post||, and the cosines between graft delta, SFT delta and post - base
   reports/diagnostics/summary.json     the headline numbers (listed by `dvc exp show`)
Accuracy along base -> post and along post -> post + lam * delta comes from the evaluate stage (the
`base_to_post_t<t>` points of diagnostics.interpolation, and the graft / SFT+merge lambda points) and is drawn by
the report (reports/diagnostics/interpolation.png). The Fisher share of paper Fig. 8 is the fisher_share stage's.
"""
from __future__ import annotations

import pandas as pd

from graft.atomic import write_json, write_parquet
from graft.cli import run_stage
from graft.diagnostics import delta_geometry, model_norm, relative_change
from graft.schema import load_all
from graft.sweep import run_tag

POST_DELTA = "tensors/delta/post_vs_base"


def main() -> None:
    p = load_all()
    models, ft, sweep = p["models"], p["finetune"], p["sweep"]
    rel, per_tensor = relative_change(models.post, models.base)
    post_norm = model_norm(models.post)
    rows = []
    for lr in ft.lrs:
        for ep in sweep.epochs:
            tag = run_tag(lr, ep)
            g, s = f"tensors/delta/graft_{tag}", f"tensors/delta/sft_{tag}"
            gs = delta_geometry(g, s)
            rows.append({"lr": lr, "epoch": ep, "graft_rel_norm": gs["norm_a"] / post_norm,
                         "sft_rel_norm": gs["norm_b"] / post_norm, "cos_graft_sft": gs["cosine"],
                         "cos_graft_post": delta_geometry(g, POST_DELTA)["cosine"],
                         "cos_sft_post": delta_geometry(s, POST_DELTA)["cosine"]})
    deltas = pd.DataFrame(rows)
    write_parquet("reports/diagnostics/weights.parquet", pd.DataFrame(per_tensor))
    write_parquet("reports/diagnostics/deltas.parquet", deltas)
    write_json("reports/diagnostics/summary.json", {
        "post_vs_base_relative_change": round(rel, 6),
        **{f"{run_tag(r.lr, r.epoch)}/{k}": round(float(getattr(r, k)), 6) for r in deltas.itertuples()
           for k in ("graft_rel_norm", "sft_rel_norm", "cos_graft_sft", "cos_graft_post", "cos_sft_post")}})
    print(f"post vs base: relative change {rel:.4f}")
    print(deltas.to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
