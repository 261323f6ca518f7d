"""Greedy accuracy of model directories on ``problems`` tables, in the real scenarios' chat and answer format
(SmolLM2's own template, final_line), and each model's weight change relative to the first one: a quick check that a
derived family is what it should be (post-training taught the skill, moved the weights a little, kept the facts).

    python research/greedy_check.py models/family/smollm2 models/family/post/epoch1 models/family/post/epoch2 \
        --table arith=data/real/arith.parquet:math --table facts=data/real/known_facts.parquet:contains
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.chat import AnswerFormat, ChatFormat, ChatSpec  # noqa: E402
from graft.generation import HFGenerator, SamplingSpec  # noqa: E402
from graft.grading import Grader  # noqa: E402
from graft.modeling import load_tokenizer  # noqa: E402


def relative_change(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    num = sum(float((wb[k].double() - wa[k].double()).norm() ** 2) for k in wa)
    den = sum(float(wa[k].double().norm() ** 2) for k in wa)
    return (num / den) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--table", action="append", required=True, help="name=path:grader")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    chat, answer = ChatSpec(True, "none", (), ""), AnswerFormat("final_line", "")
    tables = {}
    for spec in args.table:
        name, rest = spec.split("=", 1)
        path, grader = rest.rsplit(":", 1)
        tables[name] = (pd.read_parquet(path), Grader(chat, answer, grader))
    for model in args.models:
        fmt = ChatFormat(load_tokenizer(model), chat, answer, model)
        gen = HFGenerator(model, fmt.stop_ids, fmt.pad_id, batch_size=32)
        scores = []
        for name, (table, grader) in tables.items():
            outs = gen.generate([fmt.prompt_ids(q) for q in table.question],
                                SamplingSpec(1, 0.0, 1.0, args.max_new_tokens, 0))
            right = sum(grader.grade(c, str(g))[1] for (c,), g in zip(outs, table.answer))
            scores.append(f"{name} {right}/{len(table)}")
        change = relative_change(args.models[0], model)
        print(f"{model}: {', '.join(scores)}; |w - w0| / |w0| = {change:.4f}", flush=True)


if __name__ == "__main__":
    main()
