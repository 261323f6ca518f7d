"""chain_mask: a chain step's delta masked at the step's rho (graft.chain), M_rho(delta_S), as stages.mask masks.

python -m stages.chain_mask --kind diagonal|kfac|random --step S  ->  tensors/chain/masked/<kind>/S/,
    reports/chain/masks/<kind>/S.json
The Fisher masks read the retention Fisher of the graft_<kind> chain's model before S (stages.chain_fisher), so each
chain protects what its own model knows, step 1's task included; the random control takes none.
"""
from __future__ import annotations

import argparse
from contextlib import ExitStack

from graft.atomic import atomic_dir, write_json
from graft.chain import delta_dir, find_step, fisher_dir, masked_dir
from graft.cli import run_stage
from graft.merging import MaskPlan, write_masked_delta
from graft.registry import FISHER_MASKS, SWEPT_MASKS, masked_method
from graft.schema import load_all
from graft.tensors import TensorReader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=SWEPT_MASKS, required=True)
    ap.add_argument("--step", required=True)
    args = ap.parse_args()
    allp = load_all()
    step, kind = find_step(allp, args.step), args.kind
    fisher = fisher_dir(masked_method(kind), step.name)
    with ExitStack() as stack:
        delta = stack.enter_context(TensorReader(delta_dir(step.name)))
        diag = kfac = None
        if kind in FISHER_MASKS:
            diag = stack.enter_context(TensorReader(fisher / "diagonal.safetensors"))
            kfac = stack.enter_context(TensorReader(fisher / "kfac.safetensors")) if kind == "kfac" else None
        seed = allp["mask"].random.seed if kind == "random" else 0   # mask.<kind>: the random control's alone
        tmp = stack.enter_context(atomic_dir(masked_dir(kind, step.name)))
        try:
            stats = write_masked_delta(MaskPlan(kind, delta, diag, kfac, seed), step.rho, tmp)
        except ValueError as e:   # the mask's own message names the single sweep's key
            raise ValueError(str(e).replace("sweep.rhos", f"chain.steps.{step.name}.rho")) from None
    write_json(f"reports/chain/masks/{kind}/{step.name}.json", {"kind": kind, "rho": step.rho, "step": step.name,
                                                                **stats})
    print(f"chain_mask {kind} {step.name}: removed {stats['masked']}/{stats['entries']} directions")


if __name__ == "__main__":
    run_stage(main)
