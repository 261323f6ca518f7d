"""facts: the embedded default's knowledge-injection facts, invented so that no model can know them beforehand.

-> data/facts/invented.parquet (a ``facts`` table: fact_id, entity, relation, phrasing, question, answer, passage
   (the entity's, graft.passages); one row per phrasing). The knowledge stage reads it when knowledge.facts.path
   points here, as it does by default; point that key at your own facts table instead and this output goes unused.
"""
from __future__ import annotations

from graft.atomic import write_parquet
from graft.cli import run_stage
from graft.knowledge import invent_facts, phrasing_table
from graft.passages import with_passages
from graft.schema import INVENTED_FACTS, load_params


def main() -> None:
    p = load_params("knowledge")
    facts = invent_facts(p.invent.entities, p.invent.relations_per_entity, p.seed)
    table = with_passages(phrasing_table(facts, p.invent.phrasings), facts)
    write_parquet(INVENTED_FACTS, table)
    print(f"facts: {len(facts)} invented facts about {p.invent.entities} entities, {len(table)} phrasings")


if __name__ == "__main__":
    run_stage(main)
