"""Off-policy data sources, all written in the ``offpolicy`` table schema."""
from __future__ import annotations

import pandas as pd

from graft.chat import parse_response
from graft.grading import math_equal

COLUMNS = ["problem_id", "question", "think", "answer", "source"]


def teacher_traces(train: pd.DataFrame) -> pd.DataFrame:
    """The gold solution is the think block; the final answer is the gold answer."""
    out = pd.DataFrame({"problem_id": train["problem_id"], "question": train["question"],
                        "think": train["solution"], "answer": train["answer"]})
    out["source"] = "teacher"
    return out[COLUMNS]


def accept_rewrites(train: pd.DataFrame, rewrites: list[str], thinking: bool) -> pd.DataFrame:
    """SynthSelf rejection: keep a rewrite only if its final answer equals the gold answer (never replaced by it).

    Returns every rewrite with its extracted answer and ``accepted`` flag; accepted rows carry the rewrite's
    reasoning as ``think``.
    """
    rows = []
    for (pid, q, gold), text in zip(zip(train["problem_id"], train["question"], train["answer"]), rewrites):
        parsed = parse_response(text, thinking)
        ok = parsed.answer is not None and parsed.answer != "" and math_equal(parsed.answer, gold) \
            and bool(parsed.think)
        rows.append({"problem_id": pid, "question": q, "think": parsed.think or "", "answer": gold,
                     "source": "synthself", "rewrite": text, "rewrite_answer": parsed.answer, "accepted": ok})
    return pd.DataFrame(rows, columns=COLUMNS + ["rewrite", "rewrite_answer", "accepted"])
