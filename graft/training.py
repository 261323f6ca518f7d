"""Training loops: causal-LM pretraining on packed text and supervised finetuning with assistant-only loss.

One optimiser recipe for every finetune (paper Appendix C): AdamW, cosine schedule with linear warmup, gradient
clipping. Everything is seeded; on CPU the same params give bitwise-identical weights.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import torch
from tqdm import tqdm
from transformers import get_cosine_schedule_with_warmup

from graft.chat import ChatFormat

IGNORE = -100


@dataclass(frozen=True)
class OptimConfig:
    lr: float
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class SFTExample:
    question: str
    think: str
    answer: str


def encode_sft(fmt: ChatFormat, ex: SFTExample, max_len: int) -> tuple[list[int], list[int]]:
    """Token ids and labels in the model's chat format; prompt tokens get IGNORE so only the assistant turn is
    learned."""
    prompt = fmt.prompt_ids(ex.question)
    resp = fmt.response_ids(ex.think, ex.answer)
    ids = (prompt + resp)[:max_len]
    labels = ([IGNORE] * len(prompt) + resp)[:max_len]
    return ids, labels


def collate(rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        attn[i, : len(x)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attn}


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over labelled positions, in fp32."""
    logits = logits[:, :-1].float()
    target = labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=IGNORE)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The finetune recipe's learning-rate factor at optimiser step ``step`` (0-based): a linear warmup that
    already moves the weights on the first step, (step + 1) / (warmup + 1), then cosine decay over the remaining
    steps. transformers' schedule gives the first step a rate of exactly 0, so a one-step finetune learned nothing."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int, first_step_at_zero: bool = False):
    """AdamW and its schedule. ``first_step_at_zero`` keeps transformers' cosine schedule (first step at rate 0),
    which the embedded world's pretraining and post-training were built with; every finetune uses
    ``warmup_cosine``."""
    # Standard practice: no weight decay on norms and biases.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=cfg.betas)
    warmup = math.ceil(cfg.warmup_ratio * total_steps)
    if first_step_at_zero:
        return opt, get_cosine_schedule_with_warmup(opt, warmup, total_steps)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, partial(warmup_cosine, warmup=warmup, total=total_steps))


def train_steps(
    model: torch.nn.Module,
    next_batch: Callable[[int], dict[str, torch.Tensor]],
    steps: int,
    cfg: OptimConfig,
    desc: str,
    log: Callable[[int, float, float], None] | None = None,
) -> list[float]:
    """Run ``steps`` optimiser steps; ``next_batch(step)`` supplies each batch. Returns the loss per step."""
    model.train()
    opt, sched = make_optimizer(model, cfg, steps, first_step_at_zero=True)   # the committed world's schedule
    losses: list[float] = []
    bar = tqdm(range(steps), desc=desc, mininterval=2.0)
    for step in bar:
        batch = next_batch(step)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = masked_lm_loss(out.logits, batch["labels"])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{desc}: loss became {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log is not None:
            log(step, losses[-1], sched.get_last_lr()[0])
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def sft_batches(encoded: Sequence[tuple[list[int], list[int]]], batch_size: int, epochs: int, seed: int,
                pad_id: int) -> list[dict[str, torch.Tensor]]:
    """Seeded shuffled mini-batches over ``epochs`` passes (the last partial batch of an epoch is kept)."""
    if not encoded:
        raise ValueError("no training examples")
    rng = random.Random(seed)
    batches = []
    for _ in range(epochs):
        order = list(range(len(encoded)))
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            batches.append(collate([encoded[j] for j in order[i: i + batch_size]], pad_id))
    return batches


def finetune_sft(model: torch.nn.Module, fmt: ChatFormat, examples: Sequence[SFTExample], max_len: int,
                 batch_size: int, epochs: int, cfg: OptimConfig, seed: int, desc: str = "finetune",
                 log: Callable[[int, float, float], None] | None = None) -> list[float]:
    torch.manual_seed(seed)
    encoded = [encode_sft(fmt, ex, max_len) for ex in examples]
    batches = sft_batches(encoded, batch_size, epochs, seed, fmt.pad_id)
    return train_steps(model, lambda s: batches[s], len(batches), cfg, desc, log)


def packed_lm_batches(token_stream: Sequence[int], seq_len: int, batch_size: int, seed: int):
    """A function step -> batch of random windows of a packed token stream (pretraining)."""
    data = torch.tensor(token_stream, dtype=torch.long)
    if len(data) <= seq_len + 1:
        raise ValueError("pretraining corpus is shorter than one sequence")
    gen = torch.Generator().manual_seed(seed)

    def next_batch(_: int) -> dict[str, torch.Tensor]:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
        ids = torch.stack([data[s: s + seq_len] for s in starts.tolist()])
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}

    return next_batch
