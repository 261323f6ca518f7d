"""Training step rows: an OPSD step (sampling from the student, a teacher forward on the demonstration-conditioned
prompt, the top-k divergence, backward, AdamW) against a supervised finetune step on the same batch of examples,
both through graft.finetuning.train, the driver every finetune stage runs."""
from __future__ import annotations

import time

import pandas as pd
import torch

from benchmarks.common import Row
from benchmarks.sizes import Size
from graft.chat import AnswerFormat, ChatFormat, ChatSpec
from graft.distributed import DistInfo
from graft.finetuning import SupervisedObjective, TrainSpec, train
from graft.modeling import load_model, load_tokenizer
from graft.opsd import OPSDExample, OPSDObjective
from graft.training import SFTExample, encode_sft

BATCH, STEPS = 4, 3


def _chat(size: Size) -> ChatFormat:
    tok = load_tokenizer(size.post)
    if size.name == "toy":   # the embedded family: think block, answer tags
        return ChatFormat(tok, ChatSpec(True, "template", ("<think>", "</think>"), ""), AnswerFormat("answer_tag", ""),
                          size.post)
    # SmolLM2's own template, no think block, the answer on the last line (docs/reference.md "Using real models")
    return ChatFormat(tok, ChatSpec(True, "none", (), ""), AnswerFormat("final_line", ""), size.post)


def _examples(size: Size) -> list[tuple[str, str, str]]:
    path = "data/world/hard_pool.parquet" if size.name == "toy" else "data/real/hard_pool.parquet"
    df = pd.read_parquet(path).head(BATCH * STEPS)
    return list(zip(df["question"], df["solution"], df["answer"]))


def _per_step(objective, model, n: int) -> tuple[float, float]:
    spec = TrainSpec(lr=1e-5, epochs=1, global_batch=BATCH, micro_batch=BATCH, warmup_ratio=0.0, weight_decay=0.01,
                     betas=(0.9, 0.95), grad_clip=1.0, seed=0)
    t0 = time.perf_counter()
    log = train(model, objective, n, spec, on_epoch_end=lambda e, m, w: None, dist_info=DistInfo())
    wall = time.perf_counter() - t0
    return wall / len(log.curve), sum(t["sample_s"] for t in log.timing) / wall


def opsd_row(size: Size) -> Row:
    fmt = _chat(size)
    rows = _examples(size)
    n = len(rows)
    sft_model = load_model(size.post)
    encoded = [encode_sft(fmt, SFTExample(q, t, a), 512) for q, t, a in rows]
    sft_s, _ = _per_step(SupervisedObjective(encoded, fmt.pad_id), sft_model, n)
    del sft_model
    student, teacher = load_model(size.post), load_model(size.post)
    objective = OPSDObjective(teacher, fmt.tokenizer, fmt, [OPSDExample(q, t, a) for q, t, a in rows], 0.5, 100,
                              1.0, 1.0, 96, 0, 1024)
    opsd_s, sampling = _per_step(objective, student, n)
    tokens = sum(len(ids) for ids, _ in encoded) / n
    return Row("OPSD step", size.name, "a finetune step on the same batch", opsd_s, sft_s, "<= 3x",
               note=f"batch {BATCH}, {STEPS} steps each, ~{tokens:.0f} tokens per example; alpha 0.5, top-k 100, up "
                    f"to 96 sampled tokens; sampling {sampling:.0%} of the OPSD step")
