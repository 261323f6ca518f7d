"""Scoring one model: the new task on held-out problems, the old task as the mean over suites that grade answers;
plain-text suites (grader ``perplexity``) are scored by likelihood (graft.text_likelihood)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from graft.chat import ChatFormat, ChatSpec, answer_format
from graft.generation import Generator, SamplingSpec, table_labels
from graft.grading import Grader
from graft.registry import PERPLEXITY
from graft.passk import mean_pass_at_k
from graft.tables import read_table

SUITES = Path("data/suites")   # the old suites as the suite stage validated them


@dataclass(frozen=True)
class Suite:
    """A table of problems, the chat format its prompts are written in, how it is graded and sampled."""
    problems: pd.DataFrame
    name: str                # the table it was read from (named in errors)
    fmt: ChatFormat
    grader: Grader
    spec: SamplingSpec


def evaluation_suites(allp) -> tuple[Suite, dict[str, Suite], dict[str, Path]]:
    """The new task, every old suite, and the table each was read from, as params.yaml declares them. Prompts are
    written with the post model's tokenizer (every point shares it)."""
    from graft.modeling import load_tokenizer

    p, gen, chat, answer, models, data, ft = (allp[s] for s in ("evaluate", "generation", "chat", "answer", "models",
                                                                 "data", "finetune"))
    tokenizer = load_tokenizer(models.post, models.trust_remote_code)
    spec_chat = ChatSpec.from_params(chat)

    def fmt_of(suite=None) -> ChatFormat:
        return ChatFormat(tokenizer, spec_chat, answer_format(answer, suite), models.post)

    spec = SamplingSpec(n=p.n_samples, temperature=p.temperature, top_p=gen.top_p, max_new_tokens=p.max_new_tokens,
                        seed=p.seed)
    new_fmt = fmt_of()
    if ft.source == "knowledge":  # recall of injected facts on held-out phrasings: greedy, exact match
        paths = {"new": Path("data/knowledge/heldout.parquet")}
        new_task = Suite(read_table(paths["new"], "problems"), str(paths["new"]), new_fmt,
                         Grader(spec_chat, new_fmt.answer, "fact"),
                         SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=p.max_new_tokens, seed=p.seed))
    else:                         # held-out mined problems: n samples at the evaluation temperature
        paths = {"new": Path("data/mined/heldout.parquet")}
        new_task = Suite(read_table(paths["new"], "hard_pool"), str(paths["new"]), new_fmt,
                         Grader(spec_chat, new_fmt.answer, "math"), spec)
    suites = {}
    for name, s in sorted(data.old_suites.items()):
        if s.grader == PERPLEXITY:   # scored by likelihood beside the retention KL (text_suites), not sampled
            continue
        paths[name] = SUITES / f"{name}.parquet"
        f = fmt_of(s)
        suites[name] = Suite(read_table(paths[name], "problems"), str(paths[name]), f,
                             Grader(spec_chat, f.answer, s.grader), spec)
    return new_task, suites, paths


@dataclass(frozen=True)
class TextSuite:
    """An old suite of plain text (grader ``perplexity``): its passages as token ids of the post model's tokenizer."""
    ids: list[list[int]]
    name: str                # the table it was read from


def text_suites(allp, fmt: ChatFormat) -> tuple[dict[str, TextSuite], dict[str, Path]]:
    """Every perplexity suite of ``data.old_suites``, tokenized with ``fmt``'s tokenizer (the post model's, as
    ``evaluation_suites`` opened it) and checked against ``generation.max_model_len``, and the table each was read
    from."""
    from graft.text_likelihood import check_texts, text_ids

    names = sorted(n for n, s in allp["data"].old_suites.items() if s.grader == PERPLEXITY)
    if not names:
        return {}, {}
    out, paths = {}, {}
    for name in names:
        paths[name] = SUITES / f"{name}.parquet"
        ids = [text_ids(fmt, t) for t in read_table(paths[name], "texts")["text"]]
        check_texts(ids, allp["generation"].max_model_len, str(paths[name]))
        out[name] = TextSuite(ids, str(paths[name]))
    return out, paths


# a samples table's columns, one row per (problem, sample) (reports/samples/<point>.parquet)
SAMPLE_COLUMNS = ("task", "problem_id", "sample", "text", "answer", "gold", "correct", "n_tokens")


def sample_and_grade(generator: Generator, suite: Suite, task: str) -> pd.DataFrame:
    """One row per (problem, sample): text, extracted answer, grade."""
    prompts = [suite.fmt.prompt_ids(q) for q in suite.problems["question"]]
    outs = generator.generate(prompts, suite.spec, labels=table_labels(suite.name, suite.problems["problem_id"]))
    rows = []
    for (pid, gold), comps in zip(zip(suite.problems["problem_id"], suite.problems["answer"]), outs):
        for j, c in enumerate(comps):
            answer, ok = suite.grader.grade(c, gold)
            rows.append({"task": task, "problem_id": pid, "sample": j, "text": c.text, "answer": answer,
                         "gold": gold, "correct": bool(ok), "n_tokens": len(c.token_ids)})
    return pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))


def task_metrics(samples: pd.DataFrame, n: int, ks: Sequence[int]) -> dict[str, float]:
    counts = samples.groupby("problem_id", sort=True)["correct"].sum().astype(int).tolist()
    out = {"pass@1": float(samples["correct"].mean())}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = mean_pass_at_k(counts, n, k)
    return out


def evaluate_model(generator: Generator, new_task: Suite, old_suites: Mapping[str, Suite], ks: Sequence[int]
                   ) -> tuple[dict, pd.DataFrame]:
    """Metrics of the new task and of every old suite (pass@1 and pass@k where k <= n), and every sample."""
    frames = [sample_and_grade(generator, new_task, "new")]
    for name in sorted(old_suites):
        frames.append(sample_and_grade(generator, old_suites[name], f"old:{name}"))
    samples = pd.concat(frames, ignore_index=True)
    metrics: dict = {"new": task_metrics(samples[samples.task == "new"], new_task.spec.n, ks)}
    for name in sorted(old_suites):
        metrics[f"old:{name}"] = task_metrics(samples[samples.task == f"old:{name}"], old_suites[name].spec.n, ks)
    metrics["new_task"] = metrics["new"]["pass@1"]
    metrics["old_task"] = sum(metrics[f"old:{n}"]["pass@1"] for n in old_suites) / len(old_suites)
    return metrics, samples
