"""The knowledge-injection data set from a ``facts`` table (one row per phrasing of a fact): the invented facts of
the ``facts`` stage, or a user's own (``knowledge.facts``).

The last ``heldout`` phrasings of every fact, in the table's row order, are never trained on; the held-out phrasings
of ``eval_facts`` seeded facts are the new task. So what is measured is recall of a fact, not of a memorised
sentence (paper Appendix A).
"""
from __future__ import annotations

import random

import pandas as pd

from graft.canonical import canonical_text
from graft.tables import TableError

QA_COLUMNS = ["problem_id", "fact_id", "phrasing", "question", "answer"]


def number_phrasings(facts: pd.DataFrame, where: str, key: str) -> pd.DataFrame:
    """The QA pairs of ``facts`` (row order kept): problem_id ``<fact_id>_p<j>`` for a fact's j-th row.

    A question asked twice (in canonical form, ``graft.canonical``) is refused: as a training phrasing of one fact
    and a held-out one of another it would leak the evaluation, and within one fact it is no second phrasing. A
    fact's phrasings ask for one answer: rows of one fact_id (ids compared as written) with different answers are
    two facts under one id, refused."""
    answers: dict[str, tuple[int, str]] = {}
    for row, (fid, a) in enumerate(zip(facts["fact_id"], facts["answer"])):
        first = answers.setdefault(fid, (row, a))
        if canonical_text(first[1]) != canonical_text(a):
            raise TableError(f"{where}: rows {first[0]} and {row} are fact {fid!r} with different answers "
                             f"({first[1]!r}, {a!r}); a fact's phrasings share one answer: give the other fact its "
                             f"own fact_id ({key})")
    seen: dict[str, int] = {}
    for row, q in enumerate(facts["question"]):
        n = canonical_text(q)
        if n in seen:
            raise TableError(f"{where}: rows {seen[n]} and {row} ask the same question {q!r}; each row of a facts "
                             f"table must be a different phrasing ({key})")
        seen[n] = row
    phrasing = facts.groupby("fact_id", sort=False).cumcount()
    return pd.DataFrame({"problem_id": facts["fact_id"] + "_p" + phrasing.astype(str), "fact_id": facts["fact_id"],
                         "phrasing": phrasing, "question": facts["question"], "answer": facts["answer"]},
                        columns=QA_COLUMNS).reset_index(drop=True)


def split_phrasings(qa: pd.DataFrame, heldout: int, where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, heldout) QA pairs: the last ``heldout`` phrasings of every fact are held out. Every fact needs at
    least one phrasing to train on."""
    counts = qa.groupby("fact_id", sort=False)["phrasing"].transform("size")
    few = qa.loc[counts <= heldout, "fact_id"].drop_duplicates()
    if len(few):
        n = int((qa.fact_id == few.iloc[0]).sum())
        raise TableError(f"{where}: fact {few.iloc[0]!r} has {n} phrasing(s) and {len(few)} fact(s) have no more than "
                         f"knowledge.heldout_phrasings ({heldout}): each fact needs a phrasing to train on beyond the "
                         "held-out ones")
    held = qa.phrasing >= counts - heldout
    return qa[~held].reset_index(drop=True), qa[held].reset_index(drop=True)


def evaluated_facts(heldout: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """The held-out phrasings of ``n`` facts drawn with ``seed`` (the new task: recall of injected facts)."""
    ids = sorted(set(heldout.fact_id))
    if n > len(ids):
        raise ValueError(f"knowledge.eval_facts ({n}) exceeds the {len(ids)} facts")
    chosen = set(random.Random(seed).sample(ids, n))
    return heldout[heldout.fact_id.isin(chosen)].reset_index(drop=True)
