"""sources: row counts and acceptance rates of every off-policy source, one table.

-> reports/offpolicy_sources.parquet (source, rows, problems, candidates, rate, rate_means)
"""
from __future__ import annotations

import json

import pandas as pd

from graft.atomic import write_parquet
from graft.cli import run_stage
from graft.registry import SOURCES
from graft.tables import read_table


def main() -> None:
    mined = len(read_table("data/mined/train.parquet", "hard_pool"))
    synth = json.loads(open("reports/synthself/summary.json").read())
    rows = []
    for source in SOURCES:
        df = pd.read_parquet(f"data/offpolicy/{source}.parquet")
        row = {"source": source, "rows": len(df), "problems": df.problem_id.nunique(), "candidates": mined}
        if source == "teacher":
            row.update(rate=len(df) / mined, rate_means="traces per mined training problem")
        elif source == "synthself":
            row.update(rate=synth["acceptance_rate"], rate_means=f"rewrites of aligner {synth['aligner']} accepted")
        elif source == "star":
            row.update(rate=df.problem_id.nunique() / mined, rate_means="mined training problems solved")
        else:
            qa = int((df.source == "knowledge").sum())
            row.update(candidates=qa, rate=qa / len(df), rate_means="share of QA pairs in the mix")
        rows.append(row)
    table = pd.DataFrame(rows)
    write_parquet("reports/offpolicy_sources.parquet", table)
    print(table.to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
