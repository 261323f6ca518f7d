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
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.chat import AnswerFormat, ChatFormat, ChatSpec  # noqa: E402
from graft.generation import HFGenerator, SamplingSpec  # noqa: E402
from graft.grading import Grader  # noqa: E402
from graft.modeling import load_tokenizer  # noqa: E402


CHAT, ANSWER = ChatSpec(True, "none", (), ""), AnswerFormat("final_line", "")


def greedy_graded(model: Path, questions: list[str], golds: list[str], grader: str, max_new_tokens: int,
                  gen: HFGenerator | None = None) -> list[tuple[str, bool]]:
    """(completion text, right) for each question, greedy in the real scenarios' format (``gen``: an open
    generator of ``model`` to reuse)."""
    fmt = ChatFormat(load_tokenizer(model), CHAT, ANSWER, model)
    gen = gen or HFGenerator(model, fmt.stop_ids, fmt.pad_id, batch_size=32)
    outs = gen.generate([fmt.prompt_ids(q) for q in questions], SamplingSpec(1, 0.0, 1.0, max_new_tokens, 0))
    g = Grader(CHAT, ANSWER, grader)
    return [(c.text, g.grade(c, str(gold))[1]) for (c,), gold in zip(outs, golds)]


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
    tables = {}
    for spec in args.table:
        name, rest = spec.split("=", 1)
        path, grader = rest.rsplit(":", 1)
        tables[name] = (pd.read_parquet(path), grader)
    for model in args.models:
        fmt = ChatFormat(load_tokenizer(model), CHAT, ANSWER, model)
        gen = HFGenerator(model, fmt.stop_ids, fmt.pad_id, batch_size=32)
        scores = []
        for name, (table, grader) in tables.items():
            graded = greedy_graded(model, list(table.question), list(table.answer), grader, args.max_new_tokens, gen)
            scores.append(f"{name} {sum(ok for _, ok in graded)}/{len(table)}")
        change = relative_change(args.models[0], model)
        print(f"{model}: {', '.join(scores)}; |w - w0| / |w0| = {change:.4f}", flush=True)


if __name__ == "__main__":
    main()
