"""Off-policy data sources, all written in the ``offpolicy`` table schema."""
from __future__ import annotations

import pandas as pd

from graft.grading import Grader

COLUMNS = ["problem_id", "question", "think", "answer", "source"]


def teacher_traces(train: pd.DataFrame) -> pd.DataFrame:
    """The gold solution is the think block; the final answer is the gold answer."""
    out = pd.DataFrame({"problem_id": train["problem_id"], "question": train["question"],
                        "think": train["solution"], "answer": train["answer"]})
    out["source"] = "teacher"
    return out[COLUMNS]


def accept_rewrites(train: pd.DataFrame, rewrites: list[str], grader: Grader) -> pd.DataFrame:
    """SynthSelf rejection: keep a rewrite only if its final answer equals the gold answer (never replaced by it).

    Returns every rewrite with its extracted answer and ``accepted`` flag; accepted rows carry the rewrite's
    reasoning as ``think``.
    """
    rows = []
    for (pid, q, gold), text in zip(zip(train["problem_id"], train["question"], train["answer"]), rewrites):
        parsed = grader.parse(text)
        ok = grader(text, gold)[1] and bool(parsed.think)
        rows.append({"problem_id": pid, "question": q, "think": parsed.think or "", "answer": gold,
                     "source": "synthself", "rewrite": text, "rewrite_answer": parsed.answer, "accepted": ok})
    return pd.DataFrame(rows, columns=COLUMNS + ["rewrite", "rewrite_answer", "accepted"])


def star_traces(train: pd.DataFrame, attempts: list[list[str]], grader: Grader) -> tuple[pd.DataFrame, pd.DataFrame]:
    """STaR: the post model's own verified successes. Per problem keep the first attempt (in sample order) whose
    final answer is right and whose think block closed; unsolved problems are dropped.

    Returns (offpolicy rows, one row per problem: problem_id, attempts, successes, kept_sample)."""
    rows, counts = [], []
    for (pid, q, gold), texts in zip(zip(train["problem_id"], train["question"], train["answer"]), attempts):
        parsed = [grader.parse(t) for t in texts]
        ok = [grader(t, gold)[1] and p.think is not None for t, p in zip(texts, parsed)]
        first = ok.index(True) if any(ok) else -1
        if first >= 0:
            p = parsed[first]
            rows.append({"problem_id": pid, "question": q, "think": p.think, "answer": p.answer, "source": "star"})
        counts.append({"problem_id": pid, "attempts": len(texts), "successes": sum(ok), "kept_sample": first})
    return pd.DataFrame(rows, columns=COLUMNS), pd.DataFrame(counts)


def select_aligner(candidates: pd.DataFrame, student_accuracy: float, gold_nll: float) -> str | None:
    """SynthSelf Eq. 6: among candidates (columns name, accuracy, nll) whose rewrites the student finds more likely
    than the gold solutions (nll < gold_nll) and that rewrite more accurately than the student itself
    (accuracy > student_accuracy), the one with the lowest student NLL (ties: name order). None if no candidate
    qualifies."""
    ok = candidates[(candidates.nll < gold_nll) & (candidates.accuracy > student_accuracy)]
    if ok.empty:
        return None
    return str(ok.sort_values(["nll", "name"]).name.iloc[0])


def mix_knowledge(qa: pd.DataFrame, replay: pd.DataFrame) -> pd.DataFrame:
    """Knowledge-injection training data (paper Appendix C): QA pairs with an empty think block, mixed with math
    traces that keep their thinking."""
    facts = pd.DataFrame({"problem_id": qa["problem_id"], "question": qa["question"], "think": "",
                          "answer": qa["answer"], "source": "knowledge"})
    return pd.concat([facts, replay[COLUMNS]], ignore_index=True)[COLUMNS]
