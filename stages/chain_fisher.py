"""chain_fisher: the retention Fisher of a chain's model before one step: the model the step lands on (graft.chain).

python -m stages.chain_fisher --chain graft_diagonal|graft_kfac --step S  ->  tensors/chain/fisher/<chain>/S/
    (diagonal.safetensors, and kfac.safetensors for graft_kfac; rollouts.parquet), reports/chain/fisher/<chain>/S.json
The model samples its own responses to the step's retention prompts (data/chain/S/retention.parquet: the old task's
and every earlier step's training questions, taken in turn), exactly as the single-step retention Fisher
(stages.fisher), fisher.* settings included; fisher.num_processes > 1 runs it under torchrun.
"""
from __future__ import annotations

import argparse
import sys

from graft.chain import FISHER_CHAINS, find_step, fisher_dir, read_state, retention_table, state_file
from graft.cli import run_stage
from graft.distributed import init_distributed, leave_distributed, relaunch_under_torchrun
from graft.openmp import use_threads
from graft.registry import masked_method
from graft.schema import load_all
from graft.tables import read_parquet
from stages.fisher import FisherOut, fisher_on_own_samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", choices=FISHER_CHAINS, required=True)
    ap.add_argument("--step", required=True)
    args = ap.parse_args()
    allp = load_all()
    step = find_step(allp, args.step)
    if relaunch_under_torchrun(allp["fisher"].num_processes, "stages.chain_fisher", sys.argv[1:]):
        return
    use_threads(allp["compute"].threads)
    info = init_distributed(allp["compute"].device)
    model_dir = read_state(state_file(args.chain, step.after))
    folder = fisher_dir(args.chain, step.name)
    # the diagonal mask needs only the diagonal; the KFAC mask scores the rest of the tensors with it too
    out = FisherOut(folder, f"reports/chain/fisher/{args.chain}/{step.name}.json", "fisher_chain",
                    kfac=args.chain == masked_method("kfac"), rollouts=folder / "rollouts.parquet")
    fisher_on_own_samples(allp, info, model_dir, read_parquet(retention_table(step.name)), out,
                          f"chain {args.chain} {step.name}")
    leave_distributed(info)


if __name__ == "__main__":
    run_stage(main)
