"""mask: M_rho(delta), the graft delta with exactly floor(rho * N) update directions removed.

python -m stages.mask --kind diagonal|kfac|random --rho R --lr L --epoch E
  diagonal: entries ranked by F_j * delta_j^2 (diagonal retention Fisher)
  kfac:     eigen-directions u_i v_j^T of every block linear layer ranked by sigma_i d_j (u_i^T dW v_j)^2, entries
            of every other tensor by the diagonal score, one global top-rho over both
  random:   a seeded random selection of the same size (a control)
-> tensors/masked/<kind>_rho<R>_lr<L>_ep<E>/ (fp32 masked delta, sharded like the delta), reports/masks/<same>.json
"""
from __future__ import annotations

import argparse

from graft.cli import run_stage
from graft.atomic import atomic_dir, write_json
from graft.merging import MaskPlan, write_masked_delta
from graft.registry import SWEPT_MASKS
from graft.schema import load_all
from graft.sweep import require, run_tag
from graft.tensors import TensorReader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=SWEPT_MASKS, required=True)
    ap.add_argument("--rho", type=float, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--epoch", type=int, required=True)
    args = ap.parse_args()
    allp = load_all()
    p = allp["mask"]
    require(args.rho, allp["sweep"].rhos, "sweep.rhos", "--rho")
    require(args.lr, allp["finetune"].lrs, "finetune.lrs", "--lr")
    require(args.epoch, allp["sweep"].epochs, "sweep.epochs", "--epoch")
    tag = run_tag(args.lr, args.epoch)
    name = f"{args.kind}_rho{args.rho}_{tag}"
    with TensorReader(f"tensors/delta/graft_{tag}") as delta, \
            TensorReader("tensors/fisher/retention/diagonal.safetensors") as fisher, \
            TensorReader("tensors/fisher/retention/kfac.safetensors") as kfac, \
            atomic_dir(f"tensors/masked/{name}") as tmp:
        # every kind gets the diagonal Fisher: random ignores it for selection but reports what it removes
        # only the random control has a seed (mask.random: the params of the random masks alone)
        plan = MaskPlan(args.kind, delta, fisher, kfac, p.random.seed if args.kind == "random" else 0)
        stats = write_masked_delta(plan, args.rho, tmp)
    write_json(f"reports/masks/{name}.json",
               {"kind": args.kind, "rho": args.rho, "lr": args.lr, "epoch": args.epoch, **stats})
    print(f"mask {name}: removed {stats['masked']}/{stats['entries']} directions, "
          f"Fisher-weighted size (diagonal metric) removed {stats['fisher_share_removed']:.1%}, "
          f"kept {stats['fisher_share_kept']:.1%}")


if __name__ == "__main__":
    run_stage(main)
