"""knowledge: the knowledge-injection data set, a closed world of invented facts (paper Appendix A and C).

-> data/knowledge/facts.parquet (fact_id, entity, relation, answer),
   data/knowledge/train.parquet (QA pairs in the training phrasings),
   data/knowledge/heldout.parquet (``problems`` schema: the held-out phrasings of knowledge.eval_facts facts, the new
   task when finetune.source is knowledge),
   data/offpolicy/knowledge.parquet (training mix: every QA pair with an empty think block + the teacher traces with
   their thinking)
"""
from __future__ import annotations

import random

import pandas as pd

from graft.atomic import write_parquet
from graft.cli import run_stage
from graft.knowledge import invent_facts, phrase_facts
from graft.offpolicy import mix_knowledge
from graft.schema import load_params
from graft.tables import read_table


def main() -> None:
    p = load_params("knowledge")
    facts = invent_facts(p.entities, p.relations_per_entity, p.seed)
    train, heldout = phrase_facts(facts, p.phrasings, p.heldout_phrasings)
    ids = sorted({f.fact_id for f in facts})
    if p.eval_facts > len(ids):
        raise ValueError(f"knowledge.eval_facts ({p.eval_facts}) exceeds the {len(ids)} facts")
    chosen = set(random.Random(p.seed).sample(ids, p.eval_facts))
    heldout = heldout[heldout.fact_id.isin(chosen)].reset_index(drop=True)
    replay = read_table("data/offpolicy/teacher.parquet", "offpolicy")
    write_parquet("data/knowledge/facts.parquet", pd.DataFrame([f.__dict__ for f in facts]))
    write_parquet("data/knowledge/train.parquet", train)
    write_parquet("data/knowledge/heldout.parquet", heldout)
    write_parquet("data/offpolicy/knowledge.parquet", mix_knowledge(train, replay))
    print(f"knowledge: {len(facts)} facts about {p.entities} entities; {len(train)} training QA pairs "
          f"+ {len(replay)} replay traces; {len(heldout)} held-out questions ({p.eval_facts} facts)")


if __name__ == "__main__":
    run_stage(main)
