"""knowledge: the knowledge-injection data set (paper Appendix A and C) from a facts table, one row per phrasing
(params.yaml ``knowledge.facts``: the facts stage's invented ones by default, or your own).

-> data/knowledge/train.parquet (QA pairs in the training phrasings: all but the last knowledge.heldout_phrasings
   of each fact),
   data/knowledge/heldout.parquet (``problems`` schema: the held-out phrasings of knowledge.eval_facts facts, the new
   task when finetune.source is knowledge),
   data/knowledge/passages.parquet (problem_id -> passage of every training QA pair, from the facts table's optional
   ``passage`` column; no rows without one: OPSD's teacher reads it when opsd.teacher_context is passage),
   data/offpolicy/knowledge.parquet (training mix: every QA pair with an empty think block + the teacher traces with
   their thinking, unless knowledge.replay is false)
"""
from __future__ import annotations

from graft.atomic import write_parquet
from graft.cli import run_stage
from graft.confine import check_apart
from graft.injection import evaluated_facts, number_phrasings, split_phrasings
from graft.inputs import InputSpec, describe, read_input
from graft.offpolicy import mix_knowledge
from graft.passages import passage_table
from graft.schema import load_params
from graft.tables import read_table

OUTS = {"its output": "data/knowledge", "its training mix": "data/offpolicy/knowledge.parquet"}


def main() -> None:
    p = load_params("knowledge")
    spec = InputSpec.from_params(p.facts, "knowledge.facts")
    check_apart(OUTS, {"knowledge.facts.path": spec.path})
    facts = read_input(spec, "facts")
    qa = number_phrasings(facts, spec.path, "knowledge.facts")
    train, heldout = split_phrasings(qa, p.heldout_phrasings, spec.path)
    passages = passage_table(facts, train, spec.path)
    heldout = evaluated_facts(heldout, p.eval_facts, p.seed)
    replay = read_table("data/offpolicy/teacher.parquet", "offpolicy")
    if not p.replay:   # knowledge.replay false: the QA pairs alone
        replay = replay.iloc[:0]
    write_parquet("data/knowledge/train.parquet", train)
    write_parquet("data/knowledge/heldout.parquet", heldout)
    write_parquet("data/knowledge/passages.parquet", passages)
    write_parquet(OUTS["its training mix"], mix_knowledge(train, replay))
    print(f"knowledge: {qa.fact_id.nunique()} facts from {describe(spec)}; {len(train)} training QA pairs "
          f"+ {len(replay)} replay traces; {len(heldout)} held-out questions ({p.eval_facts} facts); "
          f"{'passages' if len(passages) else 'no passages'}")


if __name__ == "__main__":
    run_stage(main)
