"""synthself: the aligner greedily rewrites each gold solution in its own words; keep rewrites with the gold answer.

-> data/offpolicy/synthself.parquet (accepted rows, ``offpolicy`` schema), reports/synthself/rewrites.parquet
(every rewrite with its grade) and reports/synthself/summary.json (acceptance rate).
"""
from __future__ import annotations

from graft.cli import run_stage
from graft.atomic import write_json, write_parquet
from graft.chat import render_prompt
from graft.generation import SamplingSpec, open_generator
from graft.offpolicy import COLUMNS, accept_rewrites
from graft.schema import load_params
from graft.tables import read_table
from graft.tasks import rewrite_question


def main() -> None:
    p, gen, chat, models = load_params("synthself", "generation", "chat", "models")
    train = read_table("data/mined/train.parquet", "hard_pool")
    prompts = [render_prompt(rewrite_question(q, s), chat.thinking) for q, s in zip(train["question"], train["solution"])]
    generator = open_generator(models.aligner, gen, models.trust_remote_code)
    outs = generator.generate(prompts, SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=p.max_new_tokens,
                                                    seed=0))
    generator.close()
    table = accept_rewrites(train, [o[0].text for o in outs], chat.thinking)
    accepted = table[table.accepted]
    rate = float(table.accepted.mean())
    write_parquet("reports/synthself/rewrites.parquet", table)
    write_json("reports/synthself/summary.json", {"rewrites": len(table), "accepted": len(accepted),
                                                  "acceptance_rate": rate})
    # An empty table is a valid result of this stage; finetuning on it (finetune.source: synthself) fails there.
    write_parquet("data/offpolicy/synthself.parquet", accepted[COLUMNS].reset_index(drop=True))
    if len(accepted) == 0:
        print("synthself: WARNING no rewrite kept the gold answer (see reports/synthself/rewrites.parquet)")
    print(f"synthself: accepted {len(accepted)}/{len(table)} rewrites ({rate:.1%})")


if __name__ == "__main__":
    run_stage(main)
