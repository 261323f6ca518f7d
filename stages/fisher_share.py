"""fisher_share: where the Fisher-weighted update mass sits (paper Fig. 8, right).

python -m stages.fisher_share --lr L --epoch E
For the graft delta and the SFT delta of that snapshot: the share of sum_j F_j delta_j^2 (retention Fisher) that falls
in the top 1% of coordinates ranked by F. -> reports/fisher_share/lr<L>_ep<E>.parquet and .json
"""
from __future__ import annotations

import argparse

import pandas as pd

from graft.cli import run_stage
from graft.atomic import write_json, write_parquet
from graft.merging import fisher_share_top
from graft.schema import load_all
from graft.sweep import require, run_tag
from graft.tensors import TensorReader

TOP = 0.01


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--epoch", type=int, required=True)
    args = ap.parse_args()
    p = load_all()
    require(args.lr, p["finetune"].lrs, "finetune.lrs", "--lr")
    require(args.epoch, p["sweep"].epochs, "sweep.epochs", "--epoch")
    tag = run_tag(args.lr, args.epoch)
    rows = []
    with TensorReader("tensors/fisher/retention/diagonal.safetensors") as fisher:
        for kind in ("graft", "sft"):
            with TensorReader(f"tensors/delta/{kind}_{tag}") as delta:
                rows.append({"delta": kind, "lr": args.lr, "epoch": args.epoch, "top_fraction_by_fisher": TOP,
                             "share_of_fisher_weighted_delta": fisher_share_top(fisher, delta, TOP)})
    df = pd.DataFrame(rows)
    write_parquet(f"reports/fisher_share/{tag}.parquet", df)
    write_json(f"reports/fisher_share/{tag}.json",
               {r["delta"]: round(r["share_of_fisher_weighted_delta"], 6) for r in rows})
    print(df.to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
