"""fisher_share: where the Fisher-weighted update mass sits (paper Fig. 8, right).

For the graft delta and the SFT delta: the share of sum_j F_j delta_j^2 (retention Fisher) that falls in the top 1%
of coordinates ranked by F. -> reports/fisher_share.parquet, reports/fisher_share.json
"""
from __future__ import annotations

import pandas as pd

from graft.atomic import write_json, write_parquet
from graft.merging import fisher_share_top
from graft.tensors import TensorReader

TOP = 0.01


def main() -> None:
    rows = []
    with TensorReader("tensors/fisher/retention/diagonal.safetensors") as fisher:
        for kind in ("graft", "sft"):
            with TensorReader(f"tensors/delta/{kind}") as delta:
                rows.append({"delta": kind, "top_fraction_by_fisher": TOP,
                             "share_of_fisher_weighted_delta": fisher_share_top(fisher, delta, TOP)})
    df = pd.DataFrame(rows)
    write_parquet("reports/fisher_share.parquet", df)
    write_json("reports/fisher_share.json", {r["delta"]: round(r["share_of_fisher_weighted_delta"], 6) for r in rows})
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
