"""Is a hard skill learnable by the real family at all, from its traces at the scenario's finetune recipe? Measured on
a probe table disjoint from the pool (data/real/hard_probe_short.parquet), so choosing the skill never looks at a
scenario's evaluation set (docs/findings/real-model.md "The hard-skill scenario").

    python research/hard_skill_probe.py --models models/family/smollm2 models/family/post/epoch2 \
        --pool data/real/hard_pool_short.parquet --probe data/real/hard_probe_short.parquet

For each model: greedy accuracy on the probe before training and its pass rate over ``--samples`` samples at
temperature 1 (is the skill hard for it; does it sometimes succeed, as STaR needs), then the model finetuned on the
first ``--n-train`` pool traces (the teacher stage's traces: the worked solution as the think block) with the
finetune recipe (AdamW, warmup + cosine, ``--lr``, ``--epochs``, ``--batch``) and greedy again, on the probe and on
the traces it trained on. Prints a JSON summary (with three completions per model) and writes it to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.chat import ChatFormat  # noqa: E402
from graft.generation import HFGenerator, SamplingSpec  # noqa: E402
from graft.grading import Grader  # noqa: E402
from graft.modeling import load_model, load_tokenizer  # noqa: E402
from graft.training import OptimConfig, SFTExample, finetune_sft  # noqa: E402
from research.greedy_check import ANSWER, CHAT  # noqa: E402

MAX_LEN = 128   # the real scenarios' finetune.max_len


def graded(gen: HFGenerator, fmt: ChatFormat, table: pd.DataFrame, spec: SamplingSpec) -> tuple[float, list[str]]:
    """Mean correctness over every problem x sample, and the first sample's text of the first three problems."""
    outs = gen.generate([fmt.prompt_ids(q) for q in table.question], spec)
    g = Grader(CHAT, ANSWER, "math")
    right = [g.grade(c, str(gold))[1] for cs, gold in zip(outs, table.answer) for c in cs]
    return sum(right) / len(right), [cs[0].text for cs in outs[:3]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", required=True)
    ap.add_argument("--pool", type=Path, required=True)
    ap.add_argument("--probe", type=Path, required=True)
    ap.add_argument("--n-train", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path(".graft/hard_skill_probe.json"))
    args = ap.parse_args()
    pool, probe = pd.read_parquet(args.pool), pd.read_parquet(args.probe)
    if set(pool.question) & set(probe.question):
        raise SystemExit("the probe shares questions with the pool")
    train = pool.iloc[: args.n_train]
    greedy = SamplingSpec(1, 0.0, 1.0, args.max_new_tokens, 0)
    sampled = SamplingSpec(args.samples, 1.0, 1.0, args.max_new_tokens, 0)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "models": {}}
    for model_dir in args.models:
        t0 = time.time()
        tok = load_tokenizer(model_dir)
        fmt = ChatFormat(tok, CHAT, ANSWER, model_dir)
        model = load_model(model_dir, "float32", False, "cpu")
        gen = HFGenerator.from_model(model, tok, fmt.stop_ids, fmt.pad_id, batch_size=32)
        row: dict = {}
        row["probe_greedy_before"], row["before_texts"] = graded(gen, fmt, probe, greedy)
        row[f"probe_pass_at_1_t1_before ({args.samples} samples)"], _ = graded(gen, fmt, probe, sampled)
        examples = [SFTExample(q, s, a) for q, s, a in zip(train.question, train.solution, train.answer)]
        losses = finetune_sft(model, fmt, examples, MAX_LEN, args.batch, args.epochs, OptimConfig(lr=args.lr), seed=0,
                              desc=f"probe {model_dir.name}")
        row["loss_first_last"] = [round(losses[0], 4), round(losses[-1], 4)]
        row["probe_greedy_after"], row["after_texts"] = graded(gen, fmt, probe, greedy)
        row["train_greedy_after"], _ = graded(gen, fmt, train, greedy)
        row["wall_s"] = round(time.time() - t0)
        report["models"][str(model_dir)] = row
        print(json.dumps({str(model_dir): row}, indent=1), flush=True)
        del model, gen
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
