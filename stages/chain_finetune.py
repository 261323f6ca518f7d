"""chain_finetune: one finetune of a chain step (graft.chain), the shared recipe (finetune.*) at the step's lr and
epochs, its last epoch kept.

python -m stages.chain_finetune --target donor --step S      ->  models/chain/donor/S (the donor on S's data: the
    step's delta, shared by every graft chain)
python -m stages.chain_finetune --target sft --step S        ->  models/chain/sft/S and its state S.json (sequential
    SFT: from the SFT chain's model before S)
python -m stages.chain_finetune --target sft_merge --step S  ->  models/chain/sft_merge_ft/S (from the SFT + merge
    chain's model before S; stages.chain_merge merges it)
python -m stages.chain_finetune --target joint --step S      ->  models/chain/joint/S and its state (post on every
    step's rows up to S, at chain.joint's lr and epochs: the reference)
each with its loss curve, reports/chain/finetune/chain_<target>_<S>.json. Resumable as stages.finetune.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

from graft.atomic import write_json, write_parquet
from graft.chain import DATA, JOINT, MODELS, find_step, model_dir, read_state, state_file, write_state
from graft.chat import open_chat
from graft.cli import TIMING, run_stage
from graft.distributed import init_distributed, leave_distributed, relaunch_under_torchrun
from graft.finetuning import SupervisedObjective, recipe_settings, spec_from_params, train_to_snapshots
from graft.hashing import content_hash
from graft.modeling import load_model, load_tokenizer
from graft.openmp import use_threads
from graft.params import Section
from graft.schema import load_all
from graft.tables import read_table
from graft.tensors import check_compatible
from graft.training import SFTExample, encode_sft

TARGETS = ("donor", "sft", "sft_merge", "joint")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=TARGETS, required=True)
    ap.add_argument("--step", required=True)
    args = ap.parse_args()
    finetune_chain_step(args.target, args.step)


def finetune_chain_step(kind: str, step_name: str) -> None:
    """One finetune of a chain step: the shared recipe (finetune.*) at the step's lr and epochs, from the donor, the
    chain's model before the step, or post (joint: on every step's rows up to this one)."""
    allp = load_all()
    p, chat, answer, models, compute = (allp[k] for k in ("finetune", "chat", "answer", "models", "compute"))
    step = find_step(allp, step_name)
    lr, epochs = (allp["chain"].joint.lr, allp["chain"].joint.epochs) if kind == JOINT else (step.lr, step.epochs)
    if relaunch_under_torchrun(p.num_processes, "stages.chain_finetune", sys.argv[1:]):
        return
    torch.use_deterministic_algorithms(True)
    use_threads(compute.threads)
    info = init_distributed(compute.device)
    if kind == "donor":
        src, out = p.donor, MODELS / "donor" / step.name
    elif kind == JOINT:
        src, out = models.post, model_dir(JOINT, step.name)
    else:   # the chain's own model before this step (its state checks the bytes)
        src = read_state(state_file(kind, step.after))
        out = model_dir(kind, step.name) if kind == "sft" else MODELS / "sft_merge_ft" / step.name
    check_compatible(src, models.post)
    data_path = str(DATA / step.name / ("trains.parquet" if kind == JOINT else "train.parquet"))
    data = read_table(data_path, "offpolicy")   # chain_data checked it against every held-out set
    model = load_model(src, p.dtype, models.trust_remote_code, info.device)
    tokenizer = load_tokenizer(src, models.trust_remote_code)
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    encoded = [encode_sft(fmt, SFTExample(q, t, a), p.max_len)
               for q, t, a in zip(data["question"], data["think"], data["answer"])]
    recipe = Section({**p, "epochs": epochs})
    name = f"chain_{kind}_{step.name}"
    log = train_to_snapshots(
        model, tokenizer, SupervisedObjective(encoded, fmt.pad_id, p.loss), len(encoded), spec_from_params(recipe, lr),
        out=out, inputs=list(dict.fromkeys([src, models.post, data_path])),
        settings={"stage": "chain_finetune", "target": kind, "lr": lr, "finetune": recipe_settings(recipe, kind == "donor"),
                  "chat": dict(chat), "answer": dict(answer)}, dist_info=info, desc=f"finetune {name}",
        live_dir=None, snapshots=[epochs])   # the loss curve is the stage's plot (reports/chain/finetune)
    if info.main:
        if kind in ("sft", JOINT):
            write_state(state_file(kind, step.name), out / f"epoch{epochs}", content_hash(out / f"epoch{epochs}"))
        write_json(f"reports/chain/finetune/{name}.json", log.curve)
        write_parquet(TIMING / f"finetune_{name}.parquet", pd.DataFrame(log.timing).assign(method=f"chain_{kind}"))
        print(f"finetune {name}: {len(encoded)} examples from {src}, {len(log.curve)} steps, "
              f"final loss {log.curve[-1]['loss']:.4f}")
    leave_distributed(info)



if __name__ == "__main__":
    run_stage(main)
