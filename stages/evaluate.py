"""evaluate: score one point (a model directory) on the new task and every old-task suite.

python -m stages.evaluate --name graft_lam0.5_rho0.05 --model models/merged/graft_lam0.5_rho0.05
    --method graft --lam 0.5 --rho 0.05
-> reports/points/<name>.json (metrics), reports/samples/<name>.parquet (one row per sample, with its grade)
"""
from __future__ import annotations

import argparse
import time

from graft.cli import run_stage
from graft.atomic import write_json, write_parquet
from graft.evaluation import evaluate_model
from graft.generation import SamplingSpec, open_generator
from graft.grading import grade_fact, grade_math
from graft.schema import load_params
from graft.tables import read_table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", required=True)
    ap.add_argument("--lam", type=float)
    ap.add_argument("--rho", type=float)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--epoch", type=int)
    ap.add_argument("--alpha", type=float)
    args = ap.parse_args()
    p, gen, chat, models, data, ft = load_params("evaluate", "generation", "chat", "models", "data", "finetune")
    if ft.source == "knowledge":  # recall of injected facts on held-out phrasings: greedy, exact match
        heldout = read_table("data/knowledge/heldout.parquet", "problems")
        new_spec = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=p.max_new_tokens, seed=p.seed)
        new_grader = grade_fact
    else:                         # held-out mined problems: n samples at the evaluation temperature
        heldout = read_table("data/mined/heldout.parquet", "hard_pool")
        new_spec, new_grader = None, grade_math
    suites = {name: read_table(path, "problems") for name, path in sorted(data.old_suites.items())}
    t0 = time.perf_counter()
    generator = open_generator(args.model, gen, models.trust_remote_code)
    t1 = time.perf_counter()
    spec = SamplingSpec(n=p.n_samples, temperature=p.temperature, top_p=gen.top_p, max_new_tokens=p.max_new_tokens,
                        seed=p.seed)
    metrics, samples = evaluate_model(generator, heldout, suites, spec, p.pass_k, chat.thinking, new_spec, new_grader)
    generator.close()
    t2 = time.perf_counter()
    point = {"name": args.name, "method": args.method, "lam": args.lam, "rho": args.rho, "lr": args.lr,
             "epoch": args.epoch, "alpha": args.alpha, **metrics}
    write_json(f"reports/points/{args.name}.json", point)
    write_parquet(f"reports/samples/{args.name}.parquet", samples)
    # timings vary run to run: kept out of the cached metrics, printed for the log
    print(f"evaluate {args.name}: new {metrics['new_task']:.3f} old {metrics['old_task']:.3f} "
          f"(engine start {t1 - t0:.1f}s, generation {t2 - t1:.1f}s)")


if __name__ == "__main__":
    run_stage(main)
