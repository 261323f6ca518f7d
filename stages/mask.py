"""mask: keep-mask zeroing exactly the top-rho fraction of graft-delta entries by F_j * delta_j^2.

python -m stages.mask --rho R  ->  tensors/masks/rho<R>.safetensors (bool, True = keep), reports/masks/rho<R>.json
"""
from __future__ import annotations

import argparse

from graft.atomic import atomic_file, write_json
from graft.merging import diagonal_scores, exact_top_rho_keep
from graft.tensors import TensorReader, save_tensors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rho", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", required=True)
    args = ap.parse_args()
    with TensorReader("tensors/fisher/diagonal.safetensors") as f, TensorReader("tensors/delta/graft.safetensors") as d:
        delta = dict(d.items())
        scores = diagonal_scores(dict(f.items()), delta)
    keep = exact_top_rho_keep(scores, args.rho)
    with atomic_file(args.out) as tmp:
        save_tensors(tmp, keep)
    total = sum(s.numel() for s in scores.values())
    masked = sum(int((~k).sum()) for k in keep.values())
    score_total = sum(float(s.sum()) for s in scores.values())
    score_masked = sum(float(s[~keep[n]].sum()) for n, s in scores.items())
    write_json(args.report, {"rho": args.rho, "entries": total, "masked": masked,
                             "score_share_masked": score_masked / score_total if score_total else 0.0})
    print(f"mask rho={args.rho}: masked {masked}/{total} entries, {score_masked / max(score_total, 1e-30):.1%} "
          f"of the Fisher-weighted delta")


if __name__ == "__main__":
    main()
