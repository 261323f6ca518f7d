"""teacher: off-policy SFT data from the gold worked solutions of the mined training problems.

-> data/offpolicy/teacher.parquet (schema ``offpolicy``: problem_id, question, think, answer, source).
"""
from __future__ import annotations

from graft.cli import run_stage
from graft.atomic import write_parquet
from graft.offpolicy import teacher_traces
from graft.tables import read_table


def main() -> None:
    train = read_table("data/mined/train.parquet", "hard_pool")
    out = teacher_traces(train)
    write_parquet("data/offpolicy/teacher.parquet", out)
    print(f"teacher: {len(out)} traces")


if __name__ == "__main__":
    run_stage(main)
