"""Per-scenario frontiers on several world seeds, from the committed params.

One `dvc exp run` per (seed, scenario), setting only `world.seed` and `finetune.source`; each run's points table,
Pareto PNG and diagnostics are copied to research/scenarios/seed<S>/<source>/ with a summary of the dominance
checks of issue 6 (graft vs SFT+merge, masked graft vs graft), and research/scenarios/summary.md collects them.
A scenario whose pipeline stops (e.g. an empty off-policy set) gets a failed.txt with the error.

Run from the repository root with the venv active, on a clean commit:

    python research/scenarios.py --seeds 0 1 --sources teacher synthself star knowledge

A world variant (further `-S` overrides, hydra syntax) goes to seed<S>/<source>-<tag>/, e.g. the pretraining-facts
world for knowledge injection at finetune lr 1e-3 (the export point must name a delta that lr produces; that
world's tokenizer also spends tokens on English, so OPSD's teacher prompts need finetune.max_len 256):

    python research/scenarios.py --seeds 0 1 --sources knowledge --tag facts --set \
        world.pretrain.fact_entities=100 world.pretrain.fact_repeats=2 'finetune.lrs=[0.001]' donors.lr=0.001 \
        finetune.max_len=256 \
        'sweep.lams=[0.5,0.75,1.0,1.25,1.5,2.0]' '~export.points' \
        '+export.points={graft_kfac_lam0.5_rho0.05_lr0.001_ep10: {delta: tensors/masked/kfac_rho0.05_lr0.001_ep10, lam: 0.5}}'

It changes the workspace (each experiment's outputs stay there; the experiments are kept by DVC, see
`dvc exp show`); `git checkout HEAD -- . && dvc checkout` restores the committed state. `--summarise` only rebuilds
the summaries from what is already in research/scenarios/.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.pareto import frontier_dominates  # noqa: E402

OUT = Path("research/scenarios")
COPIED = ["reports/points.parquet", "reports/pareto.png", "reports/diagnostics/summary.json",
          "reports/diagnostics/interpolation.png", "reports/metrics.json"]
# the lambda families (post is their lambda = 0 point) and the checks the issue names
LAM_METHODS = ["graft", "sft_merge", "graft_diagonal", "graft_kfac", "graft_random"]
CHECKS = {"graft > sft_merge": ("graft", "sft_merge"), "sft_merge > graft": ("sft_merge", "graft"),
          "graft_diagonal > graft": ("graft_diagonal", "graft"),
          "graft_kfac > graft": ("graft_kfac", "graft"), "graft_diagonal > graft_random": ("graft_diagonal",
                                                                                         "graft_random")}


def margins(params: dict, source: str) -> tuple[float, float]:
    """Two standard errors of a pass@1 estimate at p = 0.5 (the widest) for the new and the old task: a difference
    smaller than this is not told apart from sampling noise (samples of one problem are correlated, so this is if
    anything generous)."""
    n_samples = params["evaluate"]["n_samples"]
    n_new = (params["knowledge"]["eval_facts"] * params["knowledge"]["heldout_phrasings"] if source == "knowledge"
             else params["mine"]["heldout"] * n_samples)
    n_old = params["world"]["eval_per_suite"] * len(params["data"]["old_suites"]) * n_samples
    return 2 * (0.25 / n_new) ** 0.5, 2 * (0.25 / n_old) ** 0.5


def summarise(points: pd.DataFrame, margin: tuple[float, float] = (0.0, 0.0)) -> dict:
    """Each method's (lam, new, old) points and the dominance checks, exact and beyond ``margin``; the lambda
    families include post (lam 0)."""
    post = points[points.method == "post"].iloc[0]
    post_xy = (float(post.new_task), float(post.old_task))
    families: dict[str, list[tuple[float, float]]] = {}
    table: dict[str, list[dict]] = {}
    for method, sub in points.groupby("method"):
        sub = sub.sort_values(["lam", "alpha"], na_position="first")
        table[method] = [{"lam": None if pd.isna(r.lam) else float(r.lam),
                          "alpha": None if pd.isna(r.alpha) else float(r.alpha),
                          "new": float(r.new_task), "old": float(r.old_task)} for r in sub.itertuples()]
        xy = [(float(r.new_task), float(r.old_task)) for r in sub.itertuples()]
        families[method] = [post_xy] + xy if method in LAM_METHODS else xy
    pairs = {name: (a, b) for name, (a, b) in CHECKS.items() if a in families and b in families}
    checks = {name: frontier_dominates(families[a], families[b]) for name, (a, b) in pairs.items()}
    beyond = {name: frontier_dominates(families[a], families[b], margin) for name, (a, b) in pairs.items()}
    return {"post": {"new": post_xy[0], "old": post_xy[1]}, "points": table, "checks": checks,
            "checks_beyond_noise": beyond, "margin": list(margin)}


def run_one(seed: int, source: str, extra: list[str]) -> tuple[bool, str, float]:
    t0 = time.time()
    cmd = ["dvc", "exp", "run", "-S", f"world.seed={seed}", "-S", f"finetune.source={source}"]
    for kv in extra:
        cmd += ["-S", kv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:], time.time() - t0


def fmt(points: list[dict], lam: float) -> str:
    hit = [p for p in points if p["lam"] == lam]
    return f"{hit[0]['new']:.2f} / {hit[0]['old']:.2f}" if hit else "-"


def write_summary(out: Path) -> None:
    params = yaml.safe_load(Path("params.yaml").read_text())
    lines = ["# Per-scenario frontiers (new task / old-task mean, pass@1)", "",
             "Written by `research/scenarios.py` from `dvc exp run -S world.seed=S -S finetune.source=X` with the "
             "committed params.yaml. Lambda families include post (lambda 0) in the dominance checks; 'beyond noise' "
             "lets each side fall short by two standard errors and asks for a gain larger than that (`margins`).", ""]
    for run in sorted(out.glob("seed*/*/")):
        seed, name = run.parent.name, run.name
        if (run / "failed.txt").exists():
            lines += [f"## {seed} / {name}: the pipeline stopped", "", "```",
                      (run / "failed.txt").read_text().strip()[-800:], "```", ""]
            continue
        if not (run / "summary.json").exists():
            continue  # still running
        s = json.loads((run / "summary.json").read_text())
        s.update(summarise(pd.read_parquet(run / "points.parquet"), margins(params, s["source"])))
        (run / "summary.json").write_text(json.dumps(s, indent=2, sort_keys=True) + "\n")
        pts = s["points"]
        lams = sorted({p["lam"] for m in LAM_METHODS for p in pts.get(m, []) if p["lam"] is not None})
        extra = "".join(f" -S {kv}" for kv in s.get("set", []))
        lines += [f"## {seed} / {name}  (off-policy rows: {s.get('rows', '?')}, wall {s.get('wall_s', 0):.0f} s)", ""]
        if extra:
            lines += [f"overrides beyond seed and source:{extra}", ""]
        lines += [f"post: {s['post']['new']:.2f} / {s['post']['old']:.2f}; "
                  + "; ".join(f"{m}: " + ", ".join(f"{p['new']:.2f} / {p['old']:.2f}"
                                                  + (f" (alpha {p['alpha']})" if p["alpha"] is not None else "")
                                                  for p in pts[m])
                              for m in ("sft", "opsd", "fisher_merge") if m in pts), "",
                  "| method | " + " | ".join(f"lam {lam}" for lam in lams) + " |",
                  "|---" * (len(lams) + 1) + "|"]
        lines += [f"| {m} | " + " | ".join(fmt(pts[m], lam) for lam in lams) + " |" for m in LAM_METHODS if m in pts]
        lines += ["", "dominance, exact: " + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in s["checks"].items()),
                  "", f"dominance beyond noise (margins {s['margin'][0]:.3f} new, {s['margin'][1]:.3f} old): "
                  + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in s["checks_beyond_noise"].items()), ""]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--sources", nargs="+", default=["teacher", "synthself", "star", "knowledge"])
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="further `dvc exp run -S` overrides (a world variant); needs --tag")
    ap.add_argument("--tag", default="", help="results go to seed<S>/<source>-<tag>/")
    ap.add_argument("--summarise", action="store_true", help="only rebuild summary.md from research/scenarios/")
    args = ap.parse_args()
    if bool(args.set) != bool(args.tag):
        ap.error("--set and --tag go together: a variant's results must not overwrite the committed scenario's")
    if not args.summarise:
        for seed in args.seeds:
            for source in args.sources:
                run = OUT / f"seed{seed}" / (f"{source}-{args.tag}" if args.tag else source)
                ok, log, wall = run_one(seed, source, args.set)
                print(f"seed {seed} {source}: {'ok' if ok else 'FAILED'} in {wall:.0f} s", flush=True)
                # replaced only now: `dvc exp run` restores the tracked files of the workspace it started from
                shutil.rmtree(run, ignore_errors=True)
                run.mkdir(parents=True)
                if not ok:
                    (run / "failed.txt").write_text(log)
                    continue
                # per-lr reports of this run only: other lrs' files stay in the workspace from earlier runs
                lrs = yaml.safe_load(Path("params.yaml").read_text())["finetune"]["lrs"]
                this_run = [p for d in ("fisher_share", "masks") for p in sorted(Path("reports", d).glob("*.json"))
                        if any(f"lr{lr}_" in p.name for lr in lrs)]
                for path in [*map(Path, COPIED), *this_run]:
                    if path.exists():  # prefixed by folder: reports/diagnostics/summary.json is not our summary
                        prefix = "" if path.parent.name == "reports" else f"{path.parent.name}_"
                        shutil.copyfile(path, run / f"{prefix}{path.name}")
                data = Path(f"data/offpolicy/{source}.parquet")  # points and checks: added by write_summary
                summary = {"seed": seed, "source": source, "set": args.set, "wall_s": round(wall),
                           "rows": len(pd.read_parquet(data)) if data.exists() else None}
                (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    write_summary(OUT)


if __name__ == "__main__":
    main()
