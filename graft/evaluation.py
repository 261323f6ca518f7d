"""Scoring one model: the new task on held-out mined problems, the old task as the mean over suites."""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import pandas as pd

from graft.chat import render_prompt
from graft.generation import Generator, SamplingSpec
from graft.grading import grade_math
from graft.passk import mean_pass_at_k


Grader = Callable[[str, str, bool], tuple]


def sample_and_grade(generator: Generator, problems: pd.DataFrame, spec: SamplingSpec, thinking: bool,
                     task: str, grader: Grader = grade_math) -> pd.DataFrame:
    """One row per (problem, sample): text, extracted answer, grade."""
    prompts = [render_prompt(q, thinking) for q in problems["question"]]
    outs = generator.generate(prompts, spec)
    rows = []
    for (pid, gold), comps in zip(zip(problems["problem_id"], problems["answer"]), outs):
        for j, c in enumerate(comps):
            answer, ok = grader(c.text, gold, thinking)
            rows.append({"task": task, "problem_id": pid, "sample": j, "text": c.text, "answer": answer,
                         "gold": gold, "correct": bool(ok), "n_tokens": len(c.token_ids)})
    return pd.DataFrame(rows, columns=["task", "problem_id", "sample", "text", "answer", "gold", "correct",
                                       "n_tokens"])


def task_metrics(samples: pd.DataFrame, n: int, ks: Sequence[int]) -> dict[str, float]:
    counts = samples.groupby("problem_id", sort=True)["correct"].sum().astype(int).tolist()
    out = {"pass@1": float(samples["correct"].mean())}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = mean_pass_at_k(counts, n, k)
    return out


def evaluate_model(generator: Generator, new_task: pd.DataFrame, old_suites: Mapping[str, pd.DataFrame],
                   spec: SamplingSpec, ks: Sequence[int], thinking: bool, new_spec: SamplingSpec | None = None,
                   new_grader: Grader = grade_math) -> tuple[dict, pd.DataFrame]:
    """``new_spec``/``new_grader`` override sampling and grading for the new task (knowledge: greedy, exact match)."""
    new_spec = new_spec or spec
    frames = [sample_and_grade(generator, new_task, new_spec, thinking, "new", new_grader)]
    for name in sorted(old_suites):
        frames.append(sample_and_grade(generator, old_suites[name], spec, thinking, f"old:{name}"))
    samples = pd.concat(frames, ignore_index=True)
    metrics: dict = {"new": task_metrics(samples[samples.task == "new"], new_spec.n, ks)}
    for name in sorted(old_suites):
        metrics[f"old:{name}"] = task_metrics(samples[samples.task == f"old:{name}"], spec.n, ks)
    metrics["new_task"] = metrics["new"]["pass@1"]
    metrics["old_task"] = sum(metrics[f"old:{n}"]["pass@1"] for n in old_suites) / len(old_suites)
    return metrics, samples
