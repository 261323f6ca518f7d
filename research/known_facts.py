"""General-knowledge questions a model answers right before any training, measured greedily (the knowledge
scenario's "facts" old suite: what finetuning could make it forget).

    python research/known_facts.py models/family/smollm2 --out data/real/known_facts.parquet

Asks the facts suite's 16 questions and scripts/real_suites.py's GENERAL ones in the model's own chat template
(params.yaml ``chat`` and ``answer``: final_line, the real scenarios' format), greedy, 40 new tokens, graded with the
``contains`` grader; writes the ones answered right (a ``problems`` table) and prints every answer.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.chat import AnswerFormat, ChatSpec, ChatFormat  # noqa: E402
from graft.generation import HFGenerator, SamplingSpec  # noqa: E402
from graft.grading import Grader  # noqa: E402
from graft.modeling import load_tokenizer  # noqa: E402
from scripts.real_suites import FACTS, GENERAL  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    chat, answer = ChatSpec(True, "none", (), ""), AnswerFormat("final_line", "")
    fmt = ChatFormat(load_tokenizer(args.model), chat, answer, args.model)
    gen = HFGenerator(args.model, fmt.stop_ids, fmt.pad_id, batch_size=16)
    pool = FACTS[:16] + GENERAL
    outs = gen.generate([fmt.prompt_ids(q) for q, _ in pool], SamplingSpec(1, 0.0, 1.0, 40, 0))
    grader, rows = Grader(chat, answer, "contains"), []
    for i, ((q, gold), (c,)) in enumerate(zip(pool, outs)):
        _, ok = grader.grade(c, gold)
        print(f"{'RIGHT' if ok else 'wrong'} | {q} | {gold} | {c.text.strip()[-100:]!r}")
        if ok:
            rows.append({"problem_id": f"known-{i:03d}", "question": q, "answer": gold})
    pd.DataFrame(rows).to_parquet(args.out, index=False)
    print(f"{len(rows)} of {len(pool)} answered right -> {args.out}")


if __name__ == "__main__":
    main()
