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
from research.greedy_check import greedy_graded  # noqa: E402
from scripts.real_suites import FACTS, GENERAL  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    pool = FACTS[:16] + GENERAL
    graded = greedy_graded(args.model, [q for q, _ in pool], [a for _, a in pool], "contains", 40)
    rows = []
    for i, ((q, gold), (text, ok)) in enumerate(zip(pool, graded)):
        print(f"{'RIGHT' if ok else 'wrong'} | {q} | {gold} | {text.strip()[-100:]!r}")
        if ok:
            rows.append({"problem_id": f"known-{i:03d}", "question": q, "answer": gold})
    pd.DataFrame(rows).to_parquet(args.out, index=False)
    print(f"{len(rows)} of {len(pool)} answered right -> {args.out}")


if __name__ == "__main__":
    main()
