"""Why old-task accuracy falls in the embedded world: old-task answers written with the new task's procedure.

For every DVC experiment (refs/exps) and the HEAD commit, reads its params (world.seed, finetune.source) and the
samples table of each point from the DVC cache, and counts, per point, the share of `add` samples whose think block
is a column *subtraction* trace in the student's style (`d-d`) or the teacher's (`minus`), and the share of new-task
(subtraction) samples answered with an addition (`d+d`) trace: the routing share epsilon of the paper's section 3, for
base (t = 0), post and every point. For knowledge injection, whose training mix pairs fact questions with an empty
think block and replays the teacher's subtraction traces, also the shares of `reverse` samples whose think block is
empty or a teacher-style subtraction. Each experiment is matched to the
research/scenarios/seed<S>/<source>[-<tag>]/ run whose recorded scores it reproduces.
Toy-world specific: this is a research probe, not a pipeline stage.

    python research/operator_confusion.py            # -> research/scenarios/operator_confusion.parquet and a table
"""
from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import yaml

CACHE = Path(".dvc/cache/files/md5")
SUB_STEP = re.compile(r"\d-\d")
ADD_STEP = re.compile(r"\d\+\d")
TEACHER_SUB = re.compile(r"\bminus\b")  # the teacher's trace wording: "ones 7 minus 4 is 3, ..."
EMPTY_THINK = re.compile(r"^\s*<think>\s*</think>")


def git_show(rev: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout


def cached(md5: str) -> Path:
    return CACHE / md5[:2] / md5[2:]


def confusion(rev: str) -> pd.DataFrame:
    params = yaml.safe_load(git_show(rev, "params.yaml"))
    lock = yaml.safe_load(git_show(rev, "dvc.lock"))
    outs = lock["stages"]["evaluate"]["outs"]
    listing = json.loads(cached([o for o in outs if o["path"] == "reports/samples"][0]["md5"]).read_text())
    rows = []
    for entry in listing:
        df = pd.read_parquet(io.BytesIO(cached(entry["md5"]).read_bytes()))
        add, reverse, new = df[df.task == "old:add"], df[df.task == "old:reverse"], df[df.task == "new"]
        rows.append({"rev": rev[:10], "seed": params["world"]["seed"], "source": params["finetune"]["source"],
                     "point": entry["relpath"].removesuffix(".parquet"),
                     "new_task": new.correct.mean(), "add": add.correct.mean(),
                     "add_with_sub_trace": add.text.str.contains(SUB_STEP).mean(),
                     "add_with_teacher_sub_trace": add.text.str.contains(TEACHER_SUB).mean(),
                     "reverse": reverse.correct.mean(),
                     "reverse_with_teacher_sub_trace": reverse.text.str.contains(TEACHER_SUB).mean(),
                     "reverse_empty_think": reverse.text.str.contains(EMPTY_THINK).mean(),
                     # the paper's epsilon (section 3): new-task inputs routed through the old task's procedure
                     "new_with_add_trace": new.text.str.contains(ADD_STEP).mean()})
    return pd.DataFrame(rows)


def main() -> None:
    refs = subprocess.run(["git", "for-each-ref", "--format=%(objectname)", "refs/exps"], capture_output=True,
                          text=True, check=True).stdout.split()
    frames = []
    for rev in dict.fromkeys(["HEAD", *refs]):
        try:
            frames.append(confusion(rev))
        except (subprocess.CalledProcessError, KeyError, IndexError, FileNotFoundError):
            continue  # an experiment that stopped before evaluating, or whose samples are not in this cache
    # keep the experiment whose scores are the ones research/scenarios.py recorded for that seed and run
    # (<source> or a world variant <source>-<tag>)
    kept = []
    for f in frames:
        seed, source = f.seed.iloc[0], f.source.iloc[0]
        folder = Path(f"research/scenarios/seed{seed}")
        for table in [folder / source / "points.parquet", *sorted(folder.glob(f"{source}-*/points.parquet"))]:
            if not table.exists():
                continue
            ref = pd.read_parquet(table).set_index("name").new_task
            if all(abs(ref.get(r.point, -1) - r.new_task) < 1e-9 for r in f.itertuples()):
                kept.append(f.assign(run=table.parent.name))
    df = pd.concat(kept).drop_duplicates(["seed", "run", "point"]).sort_values(["seed", "run", "point"])
    out = Path("research/scenarios/operator_confusion.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out, index=False)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(df.drop(columns="rev").round(3).to_string(index=False))


if __name__ == "__main__":
    main()
