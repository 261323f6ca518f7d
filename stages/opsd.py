"""opsd: the on-policy self-distillation baseline, trained from the post model with the finetune recipe.

python -m stages.opsd --alpha A --lr L  ->  models/opsd/alpha<A>_lr<L>/epoch<e>/ (HF model dirs),
    reports/opsd/alpha<A>_lr<L>.json (loss curve), .graft/timing/opsd_alpha<A>_lr<L>.parquet (per-step seconds
    split into sampling and update; a measurement, not a DVC output)
Each step: the student samples one response per problem, a frozen copy of the post model conditioned on the
demonstration (or, opsd.teacher_context passage, on the knowledge passage of data/knowledge/passages.parquet) scores
it, and the student follows D_alpha on the teacher's top-k tokens (graft/opsd.py).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import pandas as pd
import torch

from graft.cli import TIMING, run_stage
from graft.openmp import use_threads
from graft.atomic import write_json, write_parquet
from graft.distributed import init_distributed, leave_distributed, relaunch_under_torchrun
from graft.finetuning import recipe_settings, spec_from_params, train_to_snapshots
from graft.chat import open_chat
from graft.modeling import load_model, load_tokenizer
from graft.offpolicy import check_no_leakage, heldout_tables
from graft.opsd import OPSDExample, OPSDObjective
from graft.schema import load_params
from graft.sweep import require
from graft.tables import read_parquet, read_table


PASSAGES = "data/knowledge/passages.parquet"


def teacher_passages(data: pd.DataFrame, teacher_context: str) -> dict[str, str]:
    """problem_id -> the passage the teacher reads (teacher_context passage: every knowledge QA pair of the training
    mix must have one; replay traces keep their demonstration); empty for demonstration."""
    if teacher_context != "passage":
        return {}
    table = read_parquet(PASSAGES)
    passages = dict(zip(table["problem_id"], table["passage"]))
    qa = data.loc[data["source"] == "knowledge", "problem_id"]
    missing = [pid for pid in qa if pid not in passages]
    if missing:
        raise ValueError(f"opsd: opsd.teacher_context is passage, but {len(missing)} of {len(qa)} knowledge QA pairs "
                         f"have no passage in {PASSAGES} (e.g. {missing[0]!r}): the facts table "
                         f"(knowledge.facts) needs a 'passage' column (or one mapped to it in "
                         f"knowledge.facts.columns), or set opsd.teacher_context: demonstration")
    return {pid: passages[pid] for pid in qa}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpha", type=float, required=True)
    ap.add_argument("--lr", type=float, required=True)
    args = ap.parse_args()
    o, p, gen, chat, answer, models, compute, data_p = load_params("opsd", "finetune", "generation", "chat", "answer",
                                                                   "models", "compute", "data")
    require(args.alpha, o.alphas, "opsd.alphas", "--alpha")
    require(args.lr, p.lrs, "finetune.lrs", "--lr")
    if relaunch_under_torchrun(p.num_processes, "stages.opsd", sys.argv[1:]):
        return
    torch.use_deterministic_algorithms(True)
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    info = init_distributed(compute.device)
    data_path = f"data/offpolicy/{p.source}.parquet"
    data = read_table(data_path, "offpolicy")
    check_no_leakage(data, data_path, heldout_tables(data_p.old_suites))
    model = load_model(models.post, p.dtype, models.trust_remote_code, info.device)
    teacher = copy.deepcopy(model).eval()  # frozen: the post model conditioned on the demonstration
    tokenizer = load_tokenizer(models.post, models.trust_remote_code)
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    passages = teacher_passages(data, o.teacher_context)
    examples = [OPSDExample(q, t, a, passages.get(pid, "")) for pid, q, t, a in
                zip(data["problem_id"], data["question"], data["think"], data["answer"])]
    objective = OPSDObjective(teacher, tokenizer, fmt, examples, args.alpha, o.top_k, o.temperature,
                              gen.top_p, o.max_new_tokens, o.seed, p.max_len, teacher_max_len=gen.max_model_len)
    name = f"alpha{args.alpha}_lr{args.lr}"
    log = train_to_snapshots(
        model, tokenizer, objective, len(examples), spec_from_params(p, args.lr), out=Path(f"models/opsd/{name}"),
        inputs=[models.post, data_path],
        settings={"stage": "opsd", "alpha": args.alpha, "lr": args.lr,
                  "finetune": recipe_settings(p, False),
                  "opsd": {k: v for k, v in o.items() if k != "alphas"},
                  "top_p": gen.top_p, "chat": dict(chat), "answer": dict(answer)}, dist_info=info, desc=f"opsd {name}",
        live_dir=Path(f"reports/opsd/live/{name}"))
    if info.main:
        write_json(f"reports/opsd/{name}.json", log.curve)
        timing = pd.DataFrame(log.timing).assign(method="opsd")
        write_parquet(TIMING / f"opsd_{name}.parquet", timing)
        share = timing.sample_s.sum() / (timing.sample_s.sum() + timing.update_s.sum())
        print(f"opsd {name}: {len(examples)} problems, {len(log.curve)} steps, final loss {log.curve[-1]['loss']:.4f}, "
              f"sampling {share:.0%} of step time")
    leave_distributed(info)


if __name__ == "__main__":
    run_stage(main)
