"""merge: write theta_post + lam * delta as a model directory (streamed, sharded and typed like the post model).

python -m stages.merge --delta tensors/masked/diagonal_rho0.05 --lam 0.5 --out models/merged/<point>
The delta is the graft delta (unmasked or masked by the mask stage) or the SFT delta (SFT+merge baseline).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from graft.cli import output_path, require_free_space, run_stage
from graft.atomic import atomic_dir
from graft.confine import check_apart
from graft.merging import merge_into_dir
from graft.schema import load_params
from graft.tensors import check_compatible, checkpoint_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delta", required=True)
    ap.add_argument("--lam", type=float, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    models = load_params("models")
    if args.lam <= 0:
        raise ValueError(f"--lam must be > 0, got {args.lam}")
    out = output_path(args.out)
    if (Path(args.delta) / "config.json").exists():   # a delta holds tensors only; a model's weights are no update
        raise ValueError(f"--delta {args.delta} is a model directory (it has a config.json), not a delta: the "
                         "merge would add a whole model to post; name a delta the sweep wrote (tensors/delta/..., "
                         "tensors/masked/...)")
    check_apart({"--out": out}, {"models.post": models.post, "--delta": args.delta})
    require_free_space(out.parent, checkpoint_bytes(models.post), f"merge into {out}")
    with atomic_dir(out) as tmp:
        merge_into_dir(models.post, args.delta, args.lam, tmp)
        check_compatible(tmp, models.post)
    print(f"merged {args.out}")


if __name__ == "__main__":
    run_stage(main)
