"""merge_fisher: the Fisher-merging baseline (Matena & Raffel 2022) of the post and SFT models.

python -m stages.merge_fisher --lam L --out models/merged/fisher_merge_lam<L>
theta = ((1-lam) F_post theta_post + lam F_sft theta_sft) / ((1-lam) F_post + lam F_sft), Fishers floored; F_post is
the retention Fisher, F_sft the SFT model's Fisher on the new-task prompts.
"""
from __future__ import annotations

import argparse

from graft.atomic import atomic_dir
from graft.merging import fisher_merge_tensor, merge_into_dir
from graft.schema import load_params
from graft.tensors import TensorReader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lam", type=float, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    models, p = load_params("models", "fisher_merge")
    if not 0 < args.lam <= 1:
        raise SystemExit(f"merge_fisher: lam must be in (0, 1] (a mixing weight), got {args.lam}")
    with TensorReader("tensors/fisher/retention/diagonal.safetensors") as f_post, \
            TensorReader("tensors/fisher/new/diagonal.safetensors") as f_sft, atomic_dir(args.out) as tmp:
        # the "delta" slot carries the SFT model's weights; the rule needs them, not a difference
        merge_into_dir(models.post, "models/finetuned/sft", args.lam, tmp,
                       combine=lambda n, w, ft: fisher_merge_tensor(w, ft, f_post.get(n), f_sft.get(n), args.lam,
                                                                    p.floor))
    print(f"merged {args.out}")


if __name__ == "__main__":
    main()
