"""chain_data: one chain step's tables (graft.chain), checked against every held-out set the chain is scored on.

python -m stages.chain_data --step S  ->  data/chain/S/
    train.parquet       the step's training rows (data/offpolicy/<source>.parquet, as the source stage wrote it)
    heldout.parquet     its held-out suite (chain.steps.S.heldout), the new task of this step
    retention.parquet   the prompts of the Fisher of the model this step lands on: the old task's retention prompts
                        and every earlier step's training questions, taken in turn (task column)
    heldouts.parquet    every step's held-out problems so far (step column) with their grading: the next step's
                        checks, and what each step's evaluation scores
    trains.parquet      every step's training rows so far (step column): the next step's checks, joint SFT's data
A step is refused, naming the rows, when its training data holds a question of its own held-out suite, of an earlier
step's, or of an old suite, or when an earlier step trained on a question of its held-out suite.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from graft.atomic import atomic_dir, write_parquet
from graft.chain import DATA, interleave, params_and_step, retention_groups, shared_questions
from graft.cli import run_stage
from graft.inputs import InputSpec, describe, read_input
from graft.offpolicy import check_no_leakage
from graft.registry import PERPLEXITY
from graft.tables import SCHEMAS, read_parquet, read_table

# heldouts.parquet: every step's held-out problems and how they are graded (the evaluation of a later step scores them)
QUESTIONS = ["step", "problem_id", "question", "answer", "grader", "format", "instruction"]
TRAINS = ["step", *SCHEMAS["offpolicy"]]                # trains.parquet: whole rows (joint SFT trains on them)


def write_step_data(out: Path, train: pd.DataFrame, heldout: pd.DataFrame, retention: pd.DataFrame,
                    heldouts: pd.DataFrame, trains: pd.DataFrame) -> None:
    with atomic_dir(out) as tmp:
        for name, df in (("train", train), ("heldout", heldout), ("retention", retention), ("heldouts", heldouts),
                         ("trains", trains)):
            write_parquet(tmp / f"{name}.parquet", df.reset_index(drop=True))


def refuse_shared(train: pd.DataFrame, train_name: str, heldout: pd.DataFrame, heldout_name: str) -> None:
    hits = shared_questions(train, heldout)
    if hits:
        rows = ", ".join(f"row {i} ({pid!r})" for i, pid in hits[:5])
        raise ValueError(f"{train_name}: {len(hits)} training rows ask a question of {heldout_name}: {rows}"
                         f"{' ...' if len(hits) > 5 else ''}; remove them from the training data (a chain step is "
                         "scored on every held-out set after it)")


def main() -> None:
    p, step = params_and_step()
    prev = DATA / step.after
    train_path = f"data/offpolicy/{step.source}.parquet"
    train = read_table(train_path, "offpolicy")
    spec_p = step.heldout
    spec = InputSpec.from_params(spec_p, f"chain.steps.{step.name}.heldout")
    heldout = read_input(spec, "problems")[["problem_id", "question", "answer"]]
    where = f"chain step {step.name} ({train_path})"
    # its own held-out suite by id and question (one task's table), the old suites as the single-step finetune does
    check_no_leakage(train, where, {f"its held-out suite {spec.path}": heldout})
    for name, s in sorted(p["data"].old_suites.items()):
        if s.grader != PERPLEXITY:
            refuse_shared(train, where, read_table(f"data/suites/{name}.parquet", "problems"), f"old suite {name}")
    earlier_heldouts, earlier_trains = read_parquet(prev / "heldouts.parquet"), read_parquet(prev / "trains.parquet")
    for name, sub in earlier_heldouts.groupby("step", sort=False):
        refuse_shared(train, where, sub, f"the held-out suite of earlier step {name}")
    for name, sub in earlier_trains.groupby("step", sort=False):
        refuse_shared(sub.reset_index(drop=True), f"earlier step {name}'s training data", heldout,
                      f"step {step.name}'s held-out suite {spec.path}")
    groups = retention_groups(read_parquet(prev / "retention.parquet"))
    prev_train = read_parquet(prev / "train.parquet")
    if len(prev_train):
        groups.append(pd.DataFrame({"problem_id": [f"{step.after}/{i}" for i in prev_train["problem_id"]],
                                    "question": prev_train["question"], "task": step.after}))
    retention = interleave(groups)
    write_step_data(DATA / step.name, train, heldout, retention,
                    pd.concat([earlier_heldouts, heldout.assign(step=step.name, grader=spec_p.grader, format=spec_p.format,
                                                               instruction=spec_p.instruction)[QUESTIONS]], ignore_index=True),
                    pd.concat([earlier_trains, train.assign(step=step.name)[TRAINS]], ignore_index=True))
    print(f"chain_data {step.name}: {len(train)} training rows from {train_path}, {len(heldout)} held-out problems "
          f"from {describe(spec)}, {len(retention)} retention prompts over {len(groups)} tasks")


if __name__ == "__main__":
    run_stage(main)
