"""Off-policy data sources, all written in the ``offpolicy`` table schema."""
from __future__ import annotations

import pandas as pd

from graft.canonical import canonical_text
from graft.generation import Completion
from graft.grading import Grader
from graft.registry import PERPLEXITY

COLUMNS = ["problem_id", "question", "think", "answer", "source"]


def teacher_traces(train: pd.DataFrame) -> pd.DataFrame:
    """The gold solution is the think block; the final answer is the gold answer."""
    out = pd.DataFrame({"problem_id": train["problem_id"], "question": train["question"],
                        "think": train["solution"], "answer": train["answer"]})
    out["source"] = "teacher"
    return out[COLUMNS]


def accept_rewrites(train: pd.DataFrame, rewrites: list[Completion], grader: Grader) -> pd.DataFrame:
    """SynthSelf rejection: keep a rewrite only if its final answer equals the gold answer (never replaced by it).

    Returns every rewrite with its extracted answer and ``accepted`` flag; accepted rows carry the rewrite's
    reasoning as ``think``.
    """
    rows = []
    for (pid, q, gold), c in zip(zip(train["problem_id"], train["question"], train["answer"]), rewrites):
        text = c.text
        parsed = grader.parse(text)
        ok = grader.grade(c, gold)[1] and bool(parsed.think)
        rows.append({"problem_id": pid, "question": q, "think": parsed.think or "", "answer": gold,
                     "source": "synthself", "rewrite": text, "rewrite_answer": parsed.answer, "accepted": ok})
    return pd.DataFrame(rows, columns=COLUMNS + ["rewrite", "rewrite_answer", "accepted"])


def star_traces(train: pd.DataFrame, attempts: list[list[Completion]], grader: Grader
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """STaR: the post model's own verified successes. Per problem keep the first attempt (in sample order) whose
    final answer is right and whose think block closed; unsolved problems are dropped.

    Returns (offpolicy rows, one row per problem: problem_id, attempts, successes, kept_sample)."""
    rows, counts = [], []
    for (pid, q, gold), comps in zip(zip(train["problem_id"], train["question"], train["answer"]), attempts):
        parsed = [grader.parse(c.text) for c in comps]
        ok = [grader.grade(c, gold)[1] and p.think is not None for c, p in zip(comps, parsed)]
        first = ok.index(True) if any(ok) else -1
        if first >= 0:
            p = parsed[first]
            rows.append({"problem_id": pid, "question": q, "think": p.think, "answer": p.answer, "source": "star"})
        counts.append({"problem_id": pid, "attempts": len(comps), "successes": sum(ok), "kept_sample": first})
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


def check_no_leakage(train: pd.DataFrame, train_path: str, heldout: dict[str, pd.DataFrame]) -> None:
    """Refuse training rows that are evaluation problems (same problem_id, or the same question in the canonical form
    of ``graft.canonical``), whatever their source, the user's own tables included: they would inflate the scores
    they are measured by."""
    ids = set(train["problem_id"])
    questions = {canonical_text(q): pid for q, pid in zip(train["question"], train["problem_id"])}
    for name, table in sorted(heldout.items()):
        hit_ids = sorted(ids & set(table["problem_id"]))
        hit_q = sorted(questions[n] for n in {canonical_text(q) for q in table["question"]} if n in questions)
        hits = sorted(set(hit_ids) | set(hit_q))
        if hits:
            raise ValueError(f"{train_path}: {len(hits)} training rows are held-out evaluation problems of {name} "
                             f"(by problem_id or question), e.g. {hits[:3]}; remove them from the training data")


HELDOUT_TABLES = {"the mined held-out problems": ("data/mined/heldout.parquet", "hard_pool"),
                  "the knowledge held-out phrasings": ("data/knowledge/heldout.parquet", "problems")}


def heldout_tables(old_suites) -> dict[str, pd.DataFrame]:
    """Every table an evaluation reads: the new task's held-out sets and the old suites (as the suite stage wrote
    them)."""
    from graft.tables import read_table

    out = {name: read_table(path, schema) for name, (path, schema) in HELDOUT_TABLES.items()}
    for name in sorted(old_suites):
        if old_suites[name].grader != PERPLEXITY:   # plain text asks no question a training row could repeat
            out[f"old suite {name}"] = read_table(f"data/suites/{name}.parquet", "problems")
    return out
