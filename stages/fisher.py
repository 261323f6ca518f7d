"""fisher: Fisher of a model on its own samples.

python -m stages.fisher --which retention  ->  the post model on old-task retention prompts: diagonal Fisher and
    KFAC factors with their eigendecompositions (tensors/fisher/retention/{diagonal,kfac}.safetensors), and the
    rollouts they were taken on (data/fisher/retention_rollouts.parquet: the evaluation measures each point's KL
    from the post model on them)
python -m stages.fisher --which new --lr L --epoch E  ->  the SFT snapshot on the mined training prompts: diagonal
    Fisher, for the Fisher-merging baseline (tensors/fisher/new_lr<L>_ep<E>/diagonal.safetensors)
With fisher.num_processes > 1 the stage runs itself under torchrun: the first process samples the rollouts and
shares them, each process takes its share (graft.fisher.rank_share), and the sums are all-reduced once. KFAC
factors are estimated fisher.kfac_layers_per_pass layers at a time (0: all in one pass) and streamed to the file,
so memory holds one group's factors, not the model's.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from graft.cli import run_stage
from graft.openmp import use_threads
from graft.atomic import atomic_file, write_json, write_parquet
from graft.chat import open_chat
from graft.distributed import broadcast_token_lists, init_distributed, leave_distributed, relaunch_under_torchrun
from graft.fisher import estimate_diag_fisher, rank_share
from graft.generation import SamplingSpec, open_generator, table_labels
from graft.inputs import InputSpec, read_input
from graft.kfac import kfac_linear_names, write_kfac
from graft.modeling import load_model
from graft.retention_kl import ROLLOUTS, rollouts_table
from graft.schema import load_all
from graft.sweep import require, run_tag
from graft.tables import read_table
from graft.tensors import save_tensors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--which", choices=["retention", "new"], required=True)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--epoch", type=int)
    args = ap.parse_args()
    which = args.which
    allp = load_all()
    p, models, data = allp["fisher"], allp["models"], allp["data"]
    if relaunch_under_torchrun(p.num_processes, "stages.fisher", sys.argv[1:]):
        return
    use_threads(allp["compute"].threads)   # before any torch work (graft.openmp)
    info = init_distributed(allp["compute"].device)
    if which == "retention":
        model_dir = models.post
        prompts_table = read_input(InputSpec.from_params(data.retention, "data.retention"), "problems")
        out = FisherOut(Path("tensors/fisher/retention"), "reports/fisher/retention.json", "fisher_retention",
                        kfac=True, rollouts=Path(ROLLOUTS))
    else:
        require(args.lr, allp["finetune"].lrs, "finetune.lrs", "--lr")
        require(args.epoch, allp["sweep"].epochs, "sweep.epochs", "--epoch")
        model_dir = f"models/finetuned/sft_lr{args.lr}/epoch{args.epoch}"
        # the new task's training prompts: facts for knowledge injection, mined problems otherwise
        prompts_table = (read_table("data/knowledge/train.parquet", "problems")
                         if allp["finetune"].source == "knowledge"
                         else read_table("data/mined/train.parquet", "hard_pool"))
        which = f"new_{run_tag(args.lr, args.epoch)}"
        out = FisherOut(Path(f"tensors/fisher/{which}"), f"reports/fisher/{which}.json", "fisher_new")
    fisher_on_own_samples(allp, info, model_dir, prompts_table, out, which)
    leave_distributed(info)


@dataclass(frozen=True)
class FisherOut:
    """Where one Fisher goes: its folder (diagonal.safetensors, kfac.safetensors), its report and the report's key,
    whether KFAC factors are estimated too, and where the rollouts are kept (None: not kept)."""
    folder: Path
    report: str
    report_key: str
    kfac: bool = False
    rollouts: Path | None = None


def fisher_on_own_samples(allp, info, model_dir: str, prompts_table, out: FisherOut, label: str) -> None:
    """The model's own samples of fisher.n_rollouts prompts from the top of ``prompts_table`` (cycling), prompted
    as the evaluation prompts it, and the Fisher on them (diagonal, and KFAC when ``out.kfac``)."""
    p, gen, chat, answer, models = (allp[k] for k in ("fisher", "generation", "chat", "answer", "models"))
    device = info.device
    rows = [i % len(prompts_table) for i in range(p.n_rollouts)]
    questions = [prompts_table["question"][i] for i in rows]
    # the model's own samples, prompted exactly as the evaluation prompts it
    fmt = open_chat(model_dir, chat, answer, models.trust_remote_code)
    prompts = [fmt.prompt_ids(q) for q in questions]
    rollouts = None
    if info.main:   # one process samples, so the rollouts are those of a one-process run
        generator = open_generator(model_dir, gen, fmt, models.trust_remote_code, device=device)
        outs = generator.generate(prompts, SamplingSpec(n=1, temperature=p.temperature, top_p=gen.top_p,
                                                        max_new_tokens=p.max_new_tokens, seed=p.seed),
                                  labels=table_labels(f"fisher {label} prompts", [prompts_table["problem_id"][i]
                                                                                 for i in rows]))
        generator.close()
        rollouts = [(pr, list(o[0].token_ids)) for pr, o in zip(prompts, outs) if o[0].token_ids]
    reduce = None
    if info.world > 1:
        prompts_of = broadcast_token_lists([pr for pr, _ in rollouts] if info.main else None, info)
        responses = broadcast_token_lists([r for _, r in rollouts] if info.main else None, info)
        rollouts = list(zip(prompts_of, responses))
        reduce = dist.all_reduce
    mine = rank_share(rollouts, info.rank, info.world)
    model = load_model(model_dir, "float32", models.trust_remote_code, device)
    fisher = estimate_diag_fisher(model, mine, fmt.pad_id, p.chunk, reduce)
    if info.main:
        with atomic_file(out.folder / "diagonal.safetensors") as tmp:
            save_tensors(tmp, fisher)
        if out.rollouts is not None:
            write_parquet(out.rollouts, rollouts_table(rollouts))
    summary = {"rollouts": len(rollouts), "diagonal_trace": sum(float(v.sum()) for v in fisher.values()),
               "mean_response_tokens": sum(len(r) for _, r in rollouts) / len(rollouts)}
    del fisher
    if out.kfac:
        layers = kfac_linear_names(model)
        summary["kfac_layers"] = len(layers)
        path = out.folder / "kfac.safetensors"
        if info.main:
            with atomic_file(path) as tmp:
                write_kfac(model, layers, mine, fmt.pad_id, p.chunk, reduce, p.kfac_layers_per_pass, tmp)
        else:   # the other processes take part in every pass's all-reduce and write nothing
            write_kfac(model, layers, mine, fmt.pad_id, p.chunk, reduce, p.kfac_layers_per_pass, None)
    if info.main:
        # under one key per kind, so that `dvc exp show` lists the two kinds' numbers under their own names
        write_json(out.report, {out.report_key: summary})
        print(f"fisher {label}: {summary}")


if __name__ == "__main__":
    run_stage(main)
