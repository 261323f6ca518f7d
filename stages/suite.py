"""suite: one old-task suite of params.yaml ``data.old_suites``, validated and written where the evaluation reads it.

python -m stages.suite --name <key of data.old_suites>  ->  data/suites/<name>.parquet (``problems`` schema; a
``perplexity`` suite: ``texts``)
One stage per suite (dvc.yaml foreach), so a user's suites, however many and wherever they are, need no dvc.yaml
edit, and changing one suite re-scores the sweep without touching the others' validation.
"""
from __future__ import annotations

import argparse

from graft.atomic import write_parquet
from graft.cli import run_stage
from graft.confine import check_apart
from graft.registry import suite_schema
from graft.inputs import InputSpec, describe, read_input
from graft.schema import load_params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    name = ap.parse_args().name
    data = load_params("data")
    if name not in data.old_suites:
        raise ValueError(f"--name {name} is not a key of params.yaml data.old_suites {sorted(data.old_suites)}")
    spec = InputSpec.from_params(data.old_suites[name], f"data.old_suites.{name}")
    check_apart({"its output": f"data/suites/{name}.parquet"}, {f"{spec.key}.path": spec.path})
    table = read_input(spec, suite_schema(data.old_suites[name].grader))
    write_parquet(f"data/suites/{name}.parquet", table)
    print(f"suite {name}: {len(table)} {'texts' if 'text' in table else 'problems'} from {describe(spec)}")


if __name__ == "__main__":
    run_stage(main)
