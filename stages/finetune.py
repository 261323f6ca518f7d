"""finetune: full finetuning of the donor (for grafting) or of the post model (for the SFT baselines) at one learning
rate of the grid, with a snapshot after every epoch.

python -m stages.finetune --target donor|sft --lr L  ->  models/finetuned/<target>_lr<L>/epoch<e>/ (HF model dirs),
    reports/finetune/<target>_lr<L>.json (loss curve, DVC plot data),
    .graft/timing/finetune_<target>_lr<L>.parquet (per-step seconds; a measurement, not a DVC output)
python -m stages.finetune --target candidate --name N  ->  the same for donors.candidates.N at donors.lr, under the
    name candidate_<N> (the donor sweep)
The target chooses the model only; data, optimiser and schedule are the same for all (paper Appendix C). With
finetune.num_processes > 1 the stage runs itself under torchrun with DDP. An interrupted run resumes from its last
checkpoint in .graft/work/.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from graft.cli import TIMING, run_stage
from graft.openmp import use_threads
from graft.registry import DONOR_METHOD, GRAFT
from graft.atomic import write_json, write_parquet
from graft.distributed import init_distributed, leave_distributed, relaunch_under_torchrun
from graft.finetuning import SupervisedObjective, recipe_settings, spec_from_params, train_to_snapshots
from graft.chat import open_chat
from graft.modeling import load_model, load_tokenizer
from graft.offpolicy import check_no_leakage, heldout_tables
from graft.schema import load_params
from graft.sweep import require
from graft.tables import read_table
from graft.tensors import CheckpointError, check_compatible
from graft.training import SFTExample, encode_sft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=["donor", "sft", "candidate"], required=True)
    ap.add_argument("--lr", type=float, help="donor and sft: a rate of finetune.lrs")
    ap.add_argument("--name", help="candidate: a key of donors.candidates")
    args = ap.parse_args()
    p, chat, answer, models, compute, data_p, donors = load_params("finetune", "chat", "answer", "models", "compute",
                                                                   "data", "donors")
    if args.target == "candidate":
        require(args.name, donors.candidates, "donors.candidates", "--name")
        args.lr = donors.lr
        src, name = donors.candidates[args.name], f"candidate_{args.name}"
    else:
        if args.lr is None:
            raise ValueError(f"--target {args.target} needs --lr")
        require(args.lr, p.lrs, "finetune.lrs", "--lr")
        src, name = (p.donor if args.target == "donor" else models.post), f"{args.target}_lr{args.lr}"
    if relaunch_under_torchrun(p.num_processes, "stages.finetune", sys.argv[1:]):
        return
    torch.use_deterministic_algorithms(True)
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    info = init_distributed(compute.device)
    try:   # the graft delta of a donor is added to the post model: refuse a mismatch before any training
        check_compatible(src, models.post)
    except CheckpointError as e:
        key = f"donors.candidates.{args.name}" if args.target == "candidate" else "finetune.donor"
        raise CheckpointError(f"params.yaml: {key} ({src}) cannot be grafted onto models.post ({models.post}): {e}"
                              + ("; list checkpoints of models.post's own family, or set donors.candidates: {}"
                                 if args.target == "candidate" else "")) from None
    data_path = f"data/offpolicy/{p.source}.parquet"
    data = read_table(data_path, "offpolicy")
    check_no_leakage(data, data_path, heldout_tables(data_p.old_suites))
    model = load_model(src, p.dtype, models.trust_remote_code, info.device)
    tokenizer = load_tokenizer(src, models.trust_remote_code)
    # donor and post learn the same targets in the post model's chat format (the one the graft is evaluated in)
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    encoded = [encode_sft(fmt, SFTExample(q, t, a), p.max_len)
               for q, t, a in zip(data["question"], data["think"], data["answer"])]
    log = train_to_snapshots(
        model, tokenizer, SupervisedObjective(encoded, fmt.pad_id, p.loss), len(encoded),
        spec_from_params(p, args.lr), out=Path(f"models/finetuned/{name}"),
        inputs=list(dict.fromkeys([src, models.post, data_path])),  # post: its tokenizer writes the targets
        settings={"stage": "finetune", "target": args.target, "lr": args.lr,
                  "finetune": recipe_settings(p, False) if args.target == "sft" else {**recipe_settings(p, False),
                                                                                       "donor": src},
                  "chat": dict(chat), "answer": dict(answer)}, dist_info=info, desc=f"finetune {name}",
        live_dir=Path(f"reports/finetune/live/{name}"))
    if info.main:
        write_json(f"reports/finetune/{name}.json", log.curve)  # a list of records: what `dvc plots` reads
        method = {"donor": GRAFT, "sft": "sft", "candidate": DONOR_METHOD}[args.target]
        write_parquet(TIMING / f"finetune_{name}.parquet", pd.DataFrame(log.timing).assign(method=method))
        print(f"finetune {name}: {len(encoded)} examples, {len(log.curve)} steps, "
              f"final loss {log.curve[-1]['loss']:.4f}")
    leave_distributed(info)


if __name__ == "__main__":
    run_stage(main)
