"""Per-step cost of the training methods, from the timing tables the finetune and opsd stages write
(.graft/timing/*.parquet, measurements kept out of DVC's hashes). Run after `dvc repro`:

    python benchmarks/step_cost.py

Prints, per run: steps, mean seconds per optimiser step, the split into sampling and weight update, and the ratio
of each method's step time to the grafting donor finetune measured in the same `dvc repro`.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def main() -> None:
    files = sorted(Path(".graft/timing").glob("*.parquet"))
    if not files:
        raise SystemExit("no .graft/timing/*.parquet: run `dvc repro` first")
    rows = []
    for f in files:
        t = pd.read_parquet(f)
        step = t.sample_s + t.update_s
        rows.append({"run": f.stem, "method": t.method.iloc[0], "steps": len(t), "s_per_step": step.mean(),
                     "sample_s": t.sample_s.mean(), "update_s": t.update_s.mean(),
                     "sampling_share": t.sample_s.sum() / step.sum()})
    df = pd.DataFrame(rows)
    graft = df[df.method == "graft"].s_per_step.mean()
    df["x_graft_step"] = df.s_per_step / graft
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


if __name__ == "__main__":
    main()
