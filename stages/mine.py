"""mine: sample the post model k times per hard problem, keep those it solves at most s times, split train/held-out.

-> data/mined/train.parquet, data/mined/heldout.parquet, data/mined/counts.parquet (one row per pool problem).
"""
from __future__ import annotations

import random

import pandas as pd

from graft.cli import run_stage
from graft.openmp import use_threads
from graft.atomic import write_parquet
from graft.chat import open_chat
from graft.confine import check_apart
from graft.generation import Completion, SamplingSpec, open_generator, table_labels
from graft.grading import Grader
from graft.inputs import InputSpec, read_input
from graft.modeling import resolve_device
from graft.schema import load_params


class MiningError(ValueError):
    pass


def mine_counts(pool: pd.DataFrame, completions: list[list[Completion]], grader: Grader) -> list[int]:
    return [sum(grader.grade(c, gold)[1] for c in samples) for gold, samples in zip(pool["answer"], completions)]


def split_mined(pool: pd.DataFrame, successes: list[int], max_successes: int, heldout: int, seed: int
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    counts = pool[["problem_id"]].copy()
    counts["successes"] = successes
    counts["kept"] = counts["successes"] <= max_successes
    kept = sorted(counts.loc[counts["kept"], "problem_id"])
    if len(kept) <= heldout:
        raise MiningError(f"mining kept {len(kept)} problems (at most {max_successes} successes), which does not "
                          f"leave any for training after mine.heldout={heldout}; raise mine.max_successes or the pool")
    random.Random(seed).shuffle(kept)
    held = set(kept[:heldout])
    counts["split"] = [("heldout" if pid in held else "train") if k else "dropped"
                       for pid, k in zip(counts["problem_id"], counts["kept"])]
    train = pool[counts["split"].eq("train").values].reset_index(drop=True)
    test = pool[counts["split"].eq("heldout").values].reset_index(drop=True)
    return train, test, counts


def main() -> None:
    p, gen, chat, answer, models, data, compute = load_params("mine", "generation", "chat", "answer", "models",
                                                              "data", "compute")
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    device = resolve_device(compute.device)
    check_apart({"the mined tables": "data/mined"}, {"data.hard_pool.path": data.hard_pool.path})
    pool = read_input(InputSpec.from_params(data.hard_pool, "data.hard_pool"), "hard_pool")
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    generator = open_generator(models.post, gen, fmt, models.trust_remote_code, device=device)
    spec = SamplingSpec(n=p.k, temperature=p.temperature, top_p=gen.top_p, max_new_tokens=p.max_new_tokens,
                        seed=p.seed)
    outs = generator.generate([fmt.prompt_ids(q) for q in pool["question"]], spec,
                              labels=table_labels(data.hard_pool.path, pool["problem_id"]))
    generator.close()
    successes = mine_counts(pool, outs, Grader(fmt.chat, fmt.answer, "math"))
    train, test, counts = split_mined(pool, successes, p.max_successes, p.heldout, p.seed)
    counts["k"] = p.k
    write_parquet("data/mined/train.parquet", train)
    write_parquet("data/mined/heldout.parquet", test)
    write_parquet("data/mined/counts.parquet", counts)
    print(f"mined: {int(counts.kept.sum())}/{len(counts)} kept; train {len(train)}, held-out {len(test)}; "
          f"mean successes {counts.successes.mean():.2f}/{p.k}")


if __name__ == "__main__":
    run_stage(main)
