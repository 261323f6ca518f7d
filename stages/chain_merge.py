"""chain_merge: one step of a merging chain (graft.chain): the chain's model before the step plus lam times its update.

python -m stages.chain_merge --chain graft|graft_<kind> --step S  ->  models/chain/<chain>/S/ (model_{S-1} + lam_S *
    M_S(delta_S): the step's delta, masked by the chain's own Fisher for a Fisher mask) and its state <S>.json
python -m stages.chain_merge --chain sft_merge --step S  ->  models/chain/sft_merge/S/ (model_{S-1} + lam_S *
    (SFT(model_{S-1}) - model_{S-1})) and its state
Each model is a complete model directory (loads in transformers and vLLM), written in the model's dtype from fp32
arithmetic (graft.merging.merge_tensor, as every single-step point).
"""
from __future__ import annotations

import argparse

from graft.atomic import atomic_dir
from graft.chain import GRAFT_CHAINS, MODELS, find_step, model_dir, read_state, state_file, update_dir, write_state
from graft.cli import run_stage
from graft.merging import merge_into_dir, merge_tensor, tensor_delta
from graft.hashing import content_hash
from graft.registry import SFT_MERGE
from graft.schema import load_all
from graft.tensors import check_compatible


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", choices=[*GRAFT_CHAINS, SFT_MERGE], required=True)
    ap.add_argument("--step", required=True)
    args = ap.parse_args()
    p = load_all()
    step = find_step(p, args.step)
    prev = read_state(state_file(args.chain, step.after))
    out = model_dir(args.chain, step.name)
    lam = step.lam
    if args.chain == SFT_MERGE:
        ft = MODELS / "sft_merge_ft" / step.name / f"epoch{step.epochs}"
        check_compatible(ft, prev)
        with atomic_dir(out) as tmp:   # prev + lam * (ft - prev), the delta of this step's SFT from its own start
            merge_into_dir(prev, ft, lam, tmp,
                           combine=lambda name, w, f: merge_tensor(w, tensor_delta(f, w, name), None, lam))
        what = f"{prev} + {lam} x ({ft} - {prev})"
    else:
        update = update_dir(args.chain, step.name)
        with atomic_dir(out) as tmp:
            merge_into_dir(prev, update, lam, tmp)
        what = f"{prev} + {lam} x {update}"
    write_state(state_file(args.chain, step.name), out, content_hash(out))
    print(f"chain_merge {args.chain} {step.name}: {what} -> {out}")


if __name__ == "__main__":
    run_stage(main)
