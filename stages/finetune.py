"""finetune: full SFT of the donor (for grafting) or of the post model (for the SFT baselines).

python -m stages.finetune --target donor|sft  ->  models/finetuned/<target>/, reports/finetune/<target>.json (loss curve)
The target chooses the model only; data, optimiser and schedule are the same for both (paper Appendix C).
"""
from __future__ import annotations

import argparse

import torch

from graft.atomic import atomic_dir, write_json
from graft.modeling import load_model, load_tokenizer, save_model_dir
from graft.schema import load_params
from graft.tables import read_table
from graft.training import OptimConfig, SFTExample, finetune_sft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=["donor", "sft"], required=True)
    target = ap.parse_args().target
    p, chat, models = load_params("finetune", "chat", "models")
    torch.use_deterministic_algorithms(True)
    src = p.donor if target == "donor" else models.post
    data = read_table(f"data/offpolicy/{p.source}.parquet", "offpolicy")
    examples = [SFTExample(q, t, a) for q, t, a in zip(data["question"], data["think"], data["answer"])]
    model = load_model(src, p.dtype, models.trust_remote_code)
    tokenizer = load_tokenizer(src, models.trust_remote_code)
    cfg = OptimConfig(lr=p.lr, betas=tuple(p.betas), weight_decay=p.weight_decay, warmup_ratio=p.warmup_ratio,
                      grad_clip=p.grad_clip)
    curve: list[dict] = []
    losses = finetune_sft(model, tokenizer, examples, chat.thinking, p.max_len, p.batch_size, p.epochs, cfg, p.seed,
                          desc=f"finetune {target}",
                          log=lambda s, loss, lr: curve.append({"step": s, "loss": loss, "lr": lr}))
    with atomic_dir(f"models/finetuned/{target}") as tmp:
        save_model_dir(model, tokenizer, tmp)
    write_json(f"reports/finetune/{target}.json", curve)  # a list of records: what `dvc plots` reads
    print(f"finetune {target}: {len(examples)} examples, {len(losses)} steps, final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
