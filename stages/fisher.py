"""fisher: Fisher of a model on its own samples.

python -m stages.fisher --which retention  ->  the post model on old-task retention prompts: diagonal Fisher and
    KFAC factors with their eigendecompositions (tensors/fisher/retention/{diagonal,kfac}.safetensors)
python -m stages.fisher --which new --lr L --epoch E  ->  the SFT snapshot on the mined training prompts: diagonal
    Fisher, for the Fisher-merging baseline (tensors/fisher/new_lr<L>_ep<E>/diagonal.safetensors)
"""
from __future__ import annotations

import argparse

from graft.cli import run_stage
from graft.atomic import atomic_file, write_json
from graft.chat import open_chat
from graft.fisher import estimate_diag_fisher
from graft.generation import SamplingSpec, open_generator, table_labels
from graft.inputs import InputSpec, read_input
from graft.kfac import eigh_factor, estimate_kfac_factors
from graft.modeling import load_model, resolve_device
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
    p, gen, chat, answer, models, data = (allp[k] for k in ("fisher", "generation", "chat", "answer", "models",
                                                             "data"))
    device = resolve_device(allp["compute"].device)
    if which == "retention":
        model_dir = models.post
        prompts_table = read_input(InputSpec.from_params(data.retention, "data.retention"), "problems")
    else:
        require(args.lr, allp["finetune"].lrs, "finetune.lrs", "--lr")
        require(args.epoch, allp["sweep"].epochs, "sweep.epochs", "--epoch")
        model_dir = f"models/finetuned/sft_lr{args.lr}/epoch{args.epoch}"
        # the new task's training prompts: facts for knowledge injection, mined problems otherwise
        prompts_table = (read_table("data/knowledge/train.parquet", "problems")
                         if allp["finetune"].source == "knowledge"
                         else read_table("data/mined/train.parquet", "hard_pool"))
        which = f"new_{run_tag(args.lr, args.epoch)}"
    rows = [i % len(prompts_table) for i in range(p.n_rollouts)]
    questions = [prompts_table["question"][i] for i in rows]
    # the model's own samples, prompted exactly as the evaluation prompts it
    fmt = open_chat(model_dir, chat, answer, models.trust_remote_code)
    prompts = [fmt.prompt_ids(q) for q in questions]
    generator = open_generator(model_dir, gen, fmt, models.trust_remote_code, device=device)
    outs = generator.generate(prompts, SamplingSpec(n=1, temperature=p.temperature, top_p=gen.top_p,
                                                    max_new_tokens=p.max_new_tokens, seed=p.seed),
                              labels=table_labels(f"fisher {which} prompts", [prompts_table["problem_id"][i]
                                                                             for i in rows]))
    generator.close()
    rollouts = [(pr, list(o[0].token_ids)) for pr, o in zip(prompts, outs) if o[0].token_ids]
    model = load_model(model_dir, "float32", models.trust_remote_code, device)
    fisher = estimate_diag_fisher(model, rollouts, fmt.pad_id, p.chunk)
    with atomic_file(f"tensors/fisher/{which}/diagonal.safetensors") as tmp:
        save_tensors(tmp, fisher)
    summary = {"rollouts": len(rollouts), "diagonal_trace": sum(float(v.sum()) for v in fisher.values()),
               "mean_response_tokens": sum(len(r) for _, r in rollouts) / len(rollouts)}
    if which == "retention":
        factors = estimate_kfac_factors(model, rollouts, fmt.pad_id, p.chunk)
        out = {}
        for layer, (Q, P) in factors.items():
            name = f"{layer}.weight"
            out[f"{name}.P_eigvals"], out[f"{name}.P_eigvecs"] = eigh_factor(P)
            out[f"{name}.Q_eigvals"], out[f"{name}.Q_eigvecs"] = eigh_factor(Q)
            out[f"{name}.P"], out[f"{name}.Q"] = P, Q
        with atomic_file("tensors/fisher/retention/kfac.safetensors") as tmp:
            save_tensors(tmp, out)
        summary["kfac_layers"] = len(factors)
    write_json(f"reports/fisher/{which}.json", summary)
    print(f"fisher {which}: {summary}")


if __name__ == "__main__":
    run_stage(main)
