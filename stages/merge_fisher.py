"""merge_fisher: the Fisher-merging baseline (Matena & Raffel 2022) of the post and SFT models.

python -m stages.merge_fisher --lam L --lr LR --epoch E --out models/merged/fisher_merge_lam<L>_lr<LR>_ep<E>
theta = ((1-lam) F_post theta_post + lam F_sft theta_sft) / ((1-lam) F_post + lam F_sft), Fishers floored; F_post is
the retention Fisher, F_sft the SFT snapshot's Fisher on the new-task prompts.
"""
from __future__ import annotations

import argparse

from graft.cli import output_path, require_free_space, run_stage
from graft.atomic import atomic_dir
from graft.merging import fisher_merge_tensor, merge_into_dir
from graft.schema import load_all
from graft.sweep import require, run_tag
from graft.tensors import TensorReader, checkpoint_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lam", type=float, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--epoch", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    allp = load_all()
    models, p = allp["models"], allp["fisher_merge"]
    require(args.lr, allp["finetune"].lrs, "finetune.lrs", "--lr")
    require(args.epoch, allp["sweep"].epochs, "sweep.epochs", "--epoch")
    tag = run_tag(args.lr, args.epoch)
    if not 0 < args.lam <= 1:
        raise ValueError(f"--lam must be in (0, 1] (a mixing weight), got {args.lam}")
    out = output_path(args.out)
    require_free_space(out.parent, checkpoint_bytes(models.post), f"merge into {out}")
    with TensorReader("tensors/fisher/retention/diagonal.safetensors") as f_post, \
            TensorReader(f"tensors/fisher/new_{tag}/diagonal.safetensors") as f_sft, atomic_dir(out) as tmp:
        # the "delta" slot carries the SFT model's weights; the rule needs them, not a difference
        merge_into_dir(models.post, f"models/finetuned/sft_lr{args.lr}/epoch{args.epoch}", args.lam, tmp,
                       combine=lambda n, w, ft: fisher_merge_tensor(w, ft, f_post.get(n), f_sft.get(n), args.lam,
                                                                    p.floor))
    print(f"merged {args.out}")


if __name__ == "__main__":
    run_stage(main)
