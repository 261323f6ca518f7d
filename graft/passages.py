"""Passages stating facts, which OPSD's teacher reads instead of the answer (paper Appendix C: for knowledge
injection the teacher is conditioned on a short wiki-style passage).

A facts table may carry an optional ``passage`` column (the same text for every phrasing of a fact); the invented
facts get one per entity, in declarative sentences that are none of the question phrasings.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from graft.tables import TableError

if TYPE_CHECKING:
    from graft.knowledge import Fact

PASSAGE = "passage"
# relation -> the sentence stating a fact of it (``graft.knowledge.RELATIONS`` has the questions)
STATEMENTS: dict[str, str] = {
    "capital": "Its capital is the city of {a}.",
    "founder": "It was founded by {a}.",
    "river": "The river {a} flows through it.",
    "year": "It was founded in the year {a}.",
    "emblem": "Its emblem shows the {a}.",
}


def entity_passages(facts: list[Fact]) -> dict[str, str]:
    """Entity -> a passage stating every fact about it: "<entity> is a realm." and one sentence per fact."""
    by_entity: dict[str, list[Fact]] = {}
    for f in facts:
        by_entity.setdefault(f.entity, []).append(f)
    return {e: " ".join([f"{e} is a realm."] + [STATEMENTS[f.relation].format(a=f.answer) for f in fs])
            for e, fs in by_entity.items()}


def with_passages(table: pd.DataFrame, facts: list[Fact]) -> pd.DataFrame:
    """A phrasing table of ``facts`` (``graft.knowledge.phrasing_table``) with its entity's passage on every row."""
    return table.assign(**{PASSAGE: table["entity"].map(entity_passages(facts))})


def passage_table(facts: pd.DataFrame, qa: pd.DataFrame, where: str) -> pd.DataFrame:
    """problem_id -> passage for the QA pairs ``qa`` (numbered from ``facts``, any subset): the facts table's optional
    ``passage`` column, which must be non-blank text and the same for every phrasing of a fact. Empty (the columns
    only) when the table has none."""
    if PASSAGE not in facts.columns:
        return pd.DataFrame({"problem_id": pd.Series(dtype=object), PASSAGE: pd.Series(dtype=object)})
    text = facts[PASSAGE].reset_index(drop=True)
    bad = ~text.map(lambda v: isinstance(v, str) and bool(v.strip()))
    if bad.any():
        raise TableError(f"{where}: row {int(bad.to_numpy().argmax())}: column {PASSAGE!r} must be non-blank text "
                         f"({int(bad.sum())} row(s))")
    by_fact = pd.DataFrame({"fact_id": facts["fact_id"].reset_index(drop=True), PASSAGE: text})
    counts = by_fact.groupby("fact_id", sort=False)[PASSAGE].nunique()
    if (counts > 1).any():
        raise TableError(f"{where}: fact {counts.index[counts.to_numpy().argmax()]!r} has {int(counts.max())} "
                         f"different passages; every phrasing of a fact needs the same {PASSAGE!r}")
    of_fact = by_fact.drop_duplicates("fact_id").set_index("fact_id")[PASSAGE]
    return pd.DataFrame({"problem_id": qa["problem_id"].to_numpy(),
                         PASSAGE: of_fact.reindex(qa["fact_id"]).to_numpy()})
