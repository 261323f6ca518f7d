"""The embedded toy world: synthetic task data and a tiny Qwen3 model family built from params.

Family: pretraining checkpoints and a base (raw-text pretraining, optionally mixed with chat turns of some suites),
a post-trained model (chat format with a think block and an answer tag, on the old tasks), and a larger same-family
aligner (same tokenizer and architecture, more capacity, additionally post-trained to rewrite solutions in its own
words).
Data: old-task eval suites (add, reverse) and a pool of hard problems (subtraction) with teacher-style gold
solutions. Eval and hard-pool problems are excluded from every training text.
"""
from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from graft.chat import AnswerFormat, ChatFormat, ChatSpec
from graft.family_chat import render_prompt, render_response
from graft.knowledge import PRETRAIN_ONSETS, RELATIONS, Fact, fact_turns, invent_facts
from graft.modeling import new_model, qwen3_config, save_model_dir, train_tokenizer
from graft.tasks import OLD_SUITES, Problem, raw_text, rewrite_question, sample_problems
from graft.training import OptimConfig, SFTExample, encode_sft, packed_lm_batches, sft_batches, train_steps

NEW_SUITE = "sub"


def build_data(p, rng: random.Random) -> dict[str, list[Problem]]:
    """Old-task eval suites and the hard pool, all distinct problems."""
    held: dict[str, list[Problem]] = {s: sample_problems(s, p.eval_per_suite, rng) for s in OLD_SUITES}
    held["hard_pool"] = sample_problems(NEW_SUITE, p.hard_pool_size, rng)
    # retention prompts for the Fisher: old-task inputs disjoint from the eval suites
    taken = {q.problem_id for qs in held.values() for q in qs}
    per_suite = -(-p.retention_size // len(OLD_SUITES))
    held["retention"] = [q for s in OLD_SUITES for q in sample_problems(s, per_suite, rng, taken)][: p.retention_size]
    return held


def problems_frame(problems: list[Problem]) -> pd.DataFrame:
    rows = [{"problem_id": q.problem_id, "suite": q.suite, "question": q.question, "answer": q.answer,
             "solution": q.teacher_trace} for q in problems]
    return pd.DataFrame(rows, columns=["problem_id", "suite", "question", "answer", "solution"])


def pretraining_corpus(n: int, rng: random.Random, exclude: set[str], chat_fraction: float = 0.0,
                       chat_suites: tuple[str, ...] = (), thinking: bool = True) -> list[str]:
    """Raw text of every suite; with ``chat_fraction`` > 0 that share of the texts is replaced by chat turns (prompt
    and a student-style response) of ``chat_suites``."""
    texts = []
    for suite in (*OLD_SUITES, NEW_SUITE):
        texts += [raw_text(q) for q in sample_problems(suite, n, rng, exclude)]
    rng.shuffle(texts)
    n_chat = int(chat_fraction * len(texts))
    if n_chat and chat_suites:
        chat = [render_prompt(q.question, thinking) + render_response(q.student_trace, q.answer, thinking)
                for s in chat_suites for q in sample_problems(s, n_chat // len(chat_suites), rng, exclude)]
        texts = texts[: len(texts) - len(chat)] + chat
        rng.shuffle(texts)
    return texts


def pretraining_facts(n_entities: int, seed: int) -> list[Fact]:
    """Facts about invented entities that pretraining states in every phrasing, so that the base knows the language
    of facts and that phrasings are interchangeable; knowledge injection then only adds entities. Their names start
    with PRETRAIN_ONSETS, which no injected name does."""
    return invent_facts(n_entities, len(RELATIONS), seed, PRETRAIN_ONSETS) if n_entities else []


def posttrain_examples(n: int, rng: random.Random, exclude: set[str], rewrite: bool) -> list[SFTExample]:
    """Chat SFT on the old tasks in the student's own style.

    The aligner (``rewrite=True``) is a more capable assistant: it also learns to restate a teacher's solution in
    the family's own style, for every suite including the new one (on problems disjoint from the hard pool).
    """
    out = []
    for suite in OLD_SUITES:
        for q in sample_problems(suite, n, rng, exclude):
            out.append(SFTExample(q.question, q.student_trace, q.answer))
    if rewrite:
        for suite in (*OLD_SUITES, NEW_SUITE):
            for q in sample_problems(suite, n // 2, rng, exclude):
                out.append(SFTExample(rewrite_question(q.question, q.teacher_trace), q.student_trace, q.answer))
    rng.shuffle(out)
    return out


def pretrain(model, tokenizer, corpus: list[str], pp, seed: int, steps: int, desc: str,
             on_checkpoint: Callable[[int], None] | None = None, checkpoint_steps: tuple[int, ...] = ()) -> list[float]:
    """Causal-LM pretraining on the packed corpus; ``on_checkpoint(step)`` snapshots mid-run (same schedule)."""
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    stream: list[int] = []
    for t in corpus:
        stream += tokenizer(t, add_special_tokens=False)["input_ids"] + [eot]
    next_batch = packed_lm_batches(stream, pp.seq_len, pp.batch_size, seed)

    def log(step: int, loss: float, lr: float) -> None:
        if on_checkpoint is not None and step + 1 in checkpoint_steps:
            on_checkpoint(step + 1)

    return train_steps(model, next_batch, steps, OptimConfig(lr=pp.lr), desc, log)


def posttrain(model, tokenizer, examples: list[SFTExample], pp, thinking: bool, seed: int, desc: str,
              lr: float) -> list[float]:
    # the family's own template (shipped in its tokenizer) renders post-training, as it renders every later stage
    fmt = ChatFormat(tokenizer, ChatSpec(thinking), AnswerFormat("answer_tag"))
    encoded = [encode_sft(fmt, ex, 256) for ex in examples]
    epochs = max(1, -(-pp.steps * pp.batch_size // len(encoded)))
    batches = sft_batches(encoded, pp.batch_size, epochs, seed, tokenizer.pad_token_id)[: pp.steps]
    return train_steps(model, lambda s: batches[s], len(batches), OptimConfig(lr=lr), desc)


def build_world(p, thinking: bool, out_models: dict[str, Path],
                write_model: Callable[[torch.nn.Module, object, Path], None]
                ) -> tuple[dict[str, pd.DataFrame], dict[str, list[float]]]:
    """Build everything; ``write_model`` saves each model as soon as it exists. Returns tables and loss curves."""
    rng = random.Random(p.seed)
    torch.manual_seed(p.seed)
    data = build_data(p, rng)
    taken = {q.problem_id for qs in data.values() for q in qs}
    corpus = pretraining_corpus(p.corpus_problems, rng, taken, p.pretrain.chat_fraction,
                                tuple(p.pretrain.chat_suites), thinking)
    facts = pretraining_facts(p.pretrain.fact_entities, p.seed)
    if facts:  # only then is the rng drawn: with no facts the world is the one built without this lever
        corpus += fact_turns(facts, thinking) * p.pretrain.fact_repeats
        rng.shuffle(corpus)
    post_ex = posttrain_examples(p.posttrain.n_examples, rng, taken, rewrite=False)
    aligner_ex = posttrain_examples(p.posttrain.n_examples, rng, taken, rewrite=True)

    tok_texts = corpus + [render_prompt(e.question, thinking) + render_response(e.think, e.answer, thinking)
                          for e in aligner_ex[:2000]]
    tok_texts += [q.teacher_trace for q in data["hard_pool"]]
    tokenizer = train_tokenizer(tok_texts, p.tokenizer_vocab_size)

    curves: dict[str, list[float]] = {}
    student = new_model(qwen3_config(tokenizer, p.student, p.max_position_embeddings), p.seed)
    ck_steps = tuple(max(1, round(f * p.pretrain.steps)) for f in p.pretrain.checkpoints)

    def save_ck(step: int) -> None:
        write_model(student, tokenizer, out_models[f"pretrain_{ck_steps.index(step)}"])

    curves["pretrain"] = pretrain(student, tokenizer, corpus, p.pretrain, p.seed, p.pretrain.steps,
                                  "pretrain student", save_ck, ck_steps)
    write_model(student, tokenizer, out_models["base"])
    curves["posttrain"] = posttrain(student, tokenizer, post_ex, p.posttrain, thinking, p.seed, "post-train student",
                                   p.posttrain.lr)
    write_model(student, tokenizer, out_models["post"])

    aligner = new_model(qwen3_config(tokenizer, p.aligner, p.max_position_embeddings), p.seed + 1)
    curves["aligner_pretrain"] = pretrain(aligner, tokenizer, corpus, p.pretrain, p.seed + 1,
                                          p.pretrain.aligner_steps, "pretrain aligner")
    curves["aligner_posttrain"] = posttrain(aligner, tokenizer, aligner_ex, p.posttrain, thinking, p.seed + 1,
                                            "post-train aligner", p.posttrain.aligner_lr)
    write_model(aligner, tokenizer, out_models["aligner"])

    tables = {s: problems_frame(data[s]) for s in OLD_SUITES}
    tables["hard_pool"] = problems_frame(data["hard_pool"])
    tables["retention"] = problems_frame(data["retention"])
    return tables, curves
