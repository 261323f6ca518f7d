"""posttrain: a narrow post-training run that derives a post model from a real model (params.yaml
``family.posttrain``; empty by default, so the embedded default never runs it).

python -m stages.posttrain --name N  ->  models/family/<N>/epoch<e>/ (HF model dirs, one per epoch: the last is the
    post model, the earlier ones are donor candidates along post-training, paper Sec. 5.3),
    reports/family/<N>.json (loss curve)
It trains ``model`` on ``data`` (question/think/answer traces, README "Your own data") in the chat format and
answer format of params.yaml ``chat`` and ``answer``, the format every later stage prompts and grades in, with the
finetune machinery (resumable, deterministic) and its own optimiser settings, so a change to ``finetune`` never
changes the post model. A small learning rate keeps post-training a small perturbation of the model, as RL
post-training is.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from graft.atomic import write_json
from graft.chat import ChatSpec, answer_format, open_chat
from graft.cli import run_stage
from graft.openmp import use_threads
from graft.distributed import init_distributed, leave_distributed
from graft.finetuning import SupervisedObjective, TrainSpec, train_to_snapshots
from graft.inputs import InputSpec, read_input
from graft.modeling import load_model, load_tokenizer
from graft.schema import load_params
from graft.sweep import require
from graft.training import SFTExample, encode_sft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    family, chat, answer, models, compute = load_params("family", "chat", "answer", "models", "compute")
    require(args.name, list(family.posttrain), "family.posttrain", "--name")
    p = family.posttrain[args.name]
    key = f"family.posttrain.{args.name}"
    torch.use_deterministic_algorithms(True)
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    info = init_distributed(compute.device)
    spec_in = InputSpec.from_params(p.data, f"{key}.data")
    data = read_input(spec_in, "offpolicy", ChatSpec.from_params(chat), answer_format(answer),
                      source=f"posttrain_{args.name}")
    model = load_model(p.model, p.dtype, models.trust_remote_code, info.device)
    tokenizer = load_tokenizer(p.model, models.trust_remote_code)
    fmt = open_chat(p.model, chat, answer, models.trust_remote_code)
    encoded = [encode_sft(fmt, SFTExample(q, t, a), p.max_len)
               for q, t, a in zip(data["question"], data["think"], data["answer"])]
    spec = TrainSpec(lr=p.lr, epochs=p.epochs, global_batch=p.global_batch_size, micro_batch=p.micro_batch_size,
                     warmup_ratio=p.warmup_ratio, weight_decay=p.weight_decay, betas=tuple(p.betas),
                     grad_clip=p.grad_clip, seed=p.seed, checkpoint_every=p.checkpoint_every)
    log = train_to_snapshots(
        model, tokenizer, SupervisedObjective(encoded, fmt.pad_id, "sft"), len(encoded), spec,
        out=Path(f"models/family/{args.name}"), inputs=[p.model, spec_in.path],
        settings={"stage": "posttrain", "posttrain": dict(p), "chat": dict(chat), "answer": dict(answer)},
        dist_info=info, desc=f"posttrain {args.name}")
    if info.main:   # under a torchrun the other ranks have nothing of their own to write
        write_json(f"reports/family/{args.name}.json", log.curve)
        print(f"posttrain {args.name}: {len(encoded)} examples, {len(log.curve)} steps, "
              f"final loss {log.curve[-1]['loss']:.4f}")
    leave_distributed(info)


if __name__ == "__main__":
    run_stage(main)
