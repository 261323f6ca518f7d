"""The per-run table of docs/findings/real-model.md of a real-model run's folder (research/real/<run>/): task scores, English perplexity,
retention KL, old items broken and the share of arithmetic samples answered with the new skill's procedure.

python research/real_table.py research/real/hard_short-seed1
prints one Markdown row per point, in the order of its tables, read from points.parquet, summary.json and
the samples; nothing is recomputed from models.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

# the hard skill's procedure ("Split 94 into 90 and 4. 90 * 8 = 720 ..."); post writes it in no arithmetic sample
PROCEDURE = re.compile(r"Split \d+ into|\d+ \* \d+")


def procedure_share(samples: Path, point: str, task: str = "old:arith") -> float | None:
    """Share of ``point``'s samples of ``task`` whose text uses the new skill's procedure (None: no samples)."""
    path = samples / f"{point}.parquet"
    if not path.exists():
        return None
    s = pd.read_parquet(path)
    s = s[s["task"] == task]
    return float(s["text"].map(lambda t: bool(PROCEDURE.search(t))).mean()) if len(s) else None


def _num(x, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and pd.isna(x)) else f"{x:.{digits}f}"


def rows(run: Path) -> list[dict]:
    points = pd.read_parquet(run / "points.parquet")
    summary = json.loads((run / "summary.json").read_text())
    broken = summary.get("broken_per_point", {})
    ppl = summary.get("perplexity", {}).get("english", {})
    out = []
    for _, p in points.iterrows():
        out.append({"point": p["name"], "new": p["new_task"], "pass@2": p.get("new/pass@2"),
                    "arith": p.get("old:arith/pass@1"), "facts": p.get("old:facts/pass@1"), "old": p["old_task"],
                    "ppl": ppl.get(p["name"]), "kl": p.get("retention_kl"), "broken": broken.get(p["name"]),
                    "procedure": procedure_share(run / "samples", p["name"])})
    return out


def markdown(run: Path) -> str:
    head = ("| point | new pass@1 | pass@2 | arith | facts | old (mean) | English ppl | retention KL | old items broken "
            "| arith answered by the procedure |")
    lines = [head, "|" + "---|" * 10]
    for r in rows(run):
        lines.append(f"| {r['point']} | {_num(r['new'])} | {_num(r['pass@2'])} | {_num(r['arith'])} | "
                     f"{_num(r['facts'])} | {_num(r['old'])} | {_num(r['ppl'])} | {_num(r['kl'], 3)} | "
                     f"{'-' if r['broken'] is None else r['broken']} | {_num(r['procedure'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run's folder, e.g. research/real/hard_short-seed0")
    print(markdown(ap.parse_args().run))


if __name__ == "__main__":
    main()
