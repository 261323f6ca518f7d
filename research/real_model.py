"""The paper's experiment on a real pretrained LM that the pipeline derives itself (docs/findings/real-model.md).

    python research/real_model.py knowledge --seed 0      # from the repository root, venv active, clean workspace

writes params.yaml = the committed params.yaml with research/real/<scenario>.yaml's keys replaced (and
knowledge.seed = --seed: another invented fact world, the same model family; in a scenario that does not train on
knowledge, mine.seed = --seed too: other held-out problems and other mining samples), runs `dvc repro` (the family
stages import the model from its pip wheel and post-train it; DVC caches every model), copies the points, Pareto plot,
diagnostics and KL report to research/real/<scenario>-seed<S>/ with the wall time, then restores the committed
params.yaml and dvc.lock (`dvc checkout` brings the default's outputs back from the cache). Ctrl-C or `kill` stops
dvc and the stage it runs and restores them too; the stages finished so far stay in the cache, so the same command
later resumes there. It exits 1 when dvc repro fails (the log's tail in <run>/failed.txt).

    python research/real_model.py hard_short_rest --seed 0 --reuse hard_short_rho-seed0
    python research/real_model.py --checks-over knowledge-seed0 knowledge_rho005-seed0

puts the named runs' point records and samples (research/real/<run>/points, samples) into reports/ first, so evaluate
keeps every point whose key still matches (same model, data, grading and code) instead of scoring it again; a point
whose key differs is scored as usual. They replace the workspace's records of the same names, as evaluate itself
would (the committed default's records come back with `git checkout reports/points`).

Disk: a scenario's workspace holds ~17 GB of model directories and tensors; with DVC's default cache.type they are
copies of the cache's. `dvc config --local cache.type hardlink,copy` before the run links them instead (stages write
new files, never into a checked-out one).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.pareto import frontier_dominates  # noqa: E402
from graft.registry import SWEPT_MASKS  # noqa: E402
from graft.sweep import run_tag  # noqa: E402
from research.scenarios import summarise  # noqa: E402

OUT = Path("research/real")
COPIED = ["reports/points.parquet", "reports/pareto.png", "reports/metrics.json", "reports/diagnostics/summary.json",
          "reports/kl/prediction.parquet", "reports/kl/summary.json", "reports/family/post.json",
          "reports/donors/choice.parquet", "reports/donors/summary.json", "reports/donors/frontiers.png"]
POINTS, SAMPLES = Path("reports/points"), Path("reports/samples")
REPLACED_WHOLE = {"old_suites", "aligners", "imports", "posttrain", "points", "offpolicy", "candidates", "steps"}   # maps of names


def overlay(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s keys replaced; nested sections merge, name -> item maps are replaced whole."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in REPLACED_WHOLE:
            out[k] = overlay(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def copy_reports(run: Path, params: dict) -> None:
    """The workspace's reports a run folder keeps, flattened (reports/kl/summary.json -> kl_summary.json), and the
    Fig. 8 share of each of this run's (lr, epoch): named from params, because a workspace also holds the committed
    default's reports of other runs."""
    shares = [Path("reports/fisher_share") / f"{run_tag(float(lr), int(ep))}.parquet"
              for lr in params["finetune"]["lrs"] for ep in params["sweep"]["epochs"]]
    for path in [*map(Path, COPIED), *shares]:
        if path.parent.name == "donors" and not params["donors"]["candidates"]:
            continue   # one donor, nothing chosen: its report would only restate the donor's frontier
        if path.exists():
            shutil.copyfile(path, run / (path.name if path.parent.name == "reports" else
                                         f"{path.parent.name}_{path.name}"))


def broken_items(samples: Path) -> pd.DataFrame:
    """Per point, the old-task problems it answers worse than post does (the mean over samples; greedy facts of the
    new task aside): which items each method breaks, with what it wrote instead."""
    post = pd.read_parquet(samples / "post.parquet")
    post = post[post.task != "new"].groupby(["task", "problem_id"])["correct"].mean()
    rows = []
    for path in sorted(samples.glob("*.parquet")):
        if path.stem == "post":
            continue
        pt = pd.read_parquet(path)
        pt = pt[pt.task != "new"]
        acc = pt.groupby(["task", "problem_id"])["correct"].mean()
        first = pt.groupby(["task", "problem_id"]).first()
        for key in acc.index[acc.reindex(post.index).lt(post).reindex(acc.index, fill_value=False)]:
            rows.append({"point": path.stem, "task": key[0], "problem_id": key[1], "post": float(post[key]),
                         "point_score": float(acc[key]), "gold": first.loc[key, "gold"],
                         "wrote": str(first.loc[key, "text"])[-160:]})
    return pd.DataFrame(rows, columns=["point", "task", "problem_id", "post", "point_score", "gold", "wrote"])


def paper_checks(points: pd.DataFrame, margin: tuple[float, float]) -> dict:
    """The comparisons the paper makes, exact and beyond ``margin``: the rho family of each mask at the largest
    lambda (unmasked graft is its rho = 0) against the lambda family (graft over lambda, post at 0), Fig. 7 right;
    KFAC against the diagonal mask at each matched (lambda, rho); the graft family (every graft point, masked or
    not) against OPSD."""
    xy = lambda sub: [(float(r.new_task), float(r.old_task)) for r in sub.itertuples()]  # noqa: E731
    post = points[points.method == "post"]
    graft = points[points.method == "graft"]
    lam = float(graft.lam.max())
    out: dict[str, dict] = {}
    family = points[points.method.str.fullmatch(r"graft(_diagonal|_kfac|_random)?")]
    opsd = points[points.method == "opsd"]
    checks = {"graft family > opsd": (family, opsd)}
    for alpha in sorted(opsd.alpha.dropna().unique()) if opsd.alpha.nunique() > 1 else []:
        # each OPSD objective on its own, and the other way round (an OPSD point may be the one that dominates)
        checks[f"graft family > opsd alpha {alpha}"] = (family, opsd[opsd.alpha == alpha])
        checks[f"opsd alpha {alpha} > graft family"] = (opsd[opsd.alpha == alpha], family)
    for mask in SWEPT_MASKS:
        rho_family = pd.concat([graft[graft.lam == lam],
                                points[(points.method == f"graft_{mask}") & (points.lam == lam)]])
        checks[f"rho family ({mask}, lam {lam}) > lambda family"] = (rho_family, pd.concat([post, graft]))
    diag = points[points.method == "graft_diagonal"]
    kfac = points[points.method == "graft_kfac"]
    for r in kfac.itertuples():
        twin = diag[(diag.lam == r.lam) & (diag.rho == r.rho)]
        if len(twin):
            checks[f"kfac > diagonal at lam {r.lam}, rho {r.rho}"] = (kfac[kfac.name == r.name], twin)
            checks[f"diagonal > kfac at lam {r.lam}, rho {r.rho}"] = (twin, kfac[kfac.name == r.name])
    for name, (a, b) in checks.items():
        if len(a) and len(b):
            out[name] = {"exact": frontier_dominates(xy(a), xy(b)),
                         "beyond_noise": frontier_dominates(xy(a), xy(b), margin)}
    return out


def margins(params: dict) -> tuple[float, float]:
    """Two standard errors at p = 0.5 (the widest) of the new task (greedy recall of every held-out phrasing, or the
    held-out mined problems' samples) and of the old task (the mean of the suites' pass@1, each over its problems x
    n_samples)."""
    kn, n = params["knowledge"], params["evaluate"]["n_samples"]
    # perplexity suites are beside the old-task mean, not in it
    sizes = [len(pd.read_parquet(s["path"])) * n for s in params["data"]["old_suites"].values()
             if s.get("grader", "math") != "perplexity"]
    var_old = sum(0.25 / m for m in sizes) / len(sizes) ** 2
    n_new = (kn["eval_facts"] * kn["heldout_phrasings"] if params["finetune"]["source"] == "knowledge"
             else params["mine"]["heldout"] * n)   # the mined held-out problems, n samples each
    return 2 * (0.25 / n_new) ** 0.5, 2 * var_old ** 0.5


def write_summary(run: Path, params: dict, head: dict) -> None:
    """summary.json (frontier and paper checks, the old-task items each point breaks) and broken_items.parquet, from
    the run folder's points table and samples."""
    broken = broken_items(run / "samples")
    broken.to_parquet(run / "broken_items.parquet", index=False)
    points, margin = pd.read_parquet(run / "points.parquet"), margins(params)
    summary = {**head, **summarise(points, margin), "paper_checks": paper_checks(points, margin),
               "broken_per_point": broken.groupby("point").size().to_dict(),
               # each plain-text suite's perplexity per point (beside the old-task mean)
               "perplexity": {c.removeprefix("old:").removesuffix("/perplexity"): points.set_index("name")[c].to_dict()
                              for c in points.columns if c.startswith("old:") and c.endswith("/perplexity")}}
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def pooled_points(runs: list[str]) -> tuple[pd.DataFrame, tuple[float, float], list[str]]:
    """The points of several runs of one scenario and seed (a cut-down run beside the full one), for checks over
    them all; their common noise margin; the names kept apart. A point two runs share with the same task scores is
    one point; with different scores (a setting the name does not carry, such as OPSD's teacher context) each run's
    is kept, renamed <name>@<run>. Proposed points are left out: each run's propose searches only its own sweep."""
    tables, margin = [], None
    for name in runs:
        src = OUT / name
        if not (src / "points.parquet").exists():
            raise SystemExit(f"--checks-over {name}: no {src}/points.parquet")
        m = margins(yaml.safe_load((src / "params.yaml").read_text()))
        if margin is not None and m != margin:
            raise SystemExit(f"--checks-over {name}: noise margins {m} differ from {runs[0]}'s {margin} (another "
                             f"grading or sample count: not pooled)")
        margin = m
        pts = pd.read_parquet(src / "points.parquet")
        tables.append(pts[~pts.method.str.startswith("proposed")].assign(run=name))
    pooled = pd.concat(tables, ignore_index=True)
    apart = [point for point, same in pooled.groupby("name")
             if same.new_task.nunique() > 1 or same.old_task.nunique() > 1]
    split = pooled.name.isin(apart)
    pooled.loc[split, "name"] = pooled.loc[split, "name"] + "@" + pooled.loc[split, "run"]
    return pooled.drop_duplicates("name").drop(columns="run").reset_index(drop=True), margin, apart


CHAIN = Path("reports/chain")


def copy_chain(run: Path, steps: list[str]) -> None:
    """Each step's report (scores, R, geometry, frontier), metrics and evaluation (points, samples) into the run
    folder: chain/<step>/..."""
    for step in steps:
        dst = run / "chain" / step
        shutil.copytree(CHAIN / "report" / step, dst)
        shutil.copytree(CHAIN / "eval" / step, dst / "eval")
        shutil.copyfile(CHAIN / "metrics" / f"{step}.json", dst / "metrics.json")


def chain_broken_items(run: Path, steps: list[str]) -> pd.DataFrame:
    """Per method and step after the first: the items (old suites and earlier steps' tasks) its model after the
    step answers worse than its model before it did (mean over samples), with what it wrote instead."""
    rows = []
    for before, after in zip(steps, steps[1:]):
        for path in sorted((run / "chain" / after / "eval" / "samples").glob("*.parquet")):
            if path.stem == "post":
                continue
            prev_path = run / "chain" / before / "eval" / "samples" / path.name
            now, prev = pd.read_parquet(path), pd.read_parquet(prev_path)
            prev = prev[prev.task != f"step:{after}"]
            acc_prev = prev.groupby(["task", "problem_id"])["correct"].mean()
            acc_now = now.groupby(["task", "problem_id"])["correct"].mean().reindex(acc_prev.index)
            first = now.groupby(["task", "problem_id"]).first()
            for key in acc_prev.index[acc_now.lt(acc_prev)]:
                rows.append({"method": path.stem, "step": after, "task": key[0], "problem_id": key[1],
                             "before": float(acc_prev[key]), "after": float(acc_now[key]),
                             "gold": first.loc[key, "gold"], "wrote": str(first.loc[key, "text"])[-160:]})
    return pd.DataFrame(rows, columns=["method", "step", "task", "problem_id", "before", "after", "gold", "wrote"])


def chain_margins(run: Path, params: dict, steps: list[str]) -> dict[str, float]:
    """Two standard errors at p = 0.5 of each task's pass@1 (its problems x samples; a fact suite: greedy, one) and of
    the old task (the mean of the graded suites)."""
    n = params["evaluate"]["n_samples"]
    out = {}
    for step in steps:
        h = params["chain"]["steps"][step]["heldout"]
        post = pd.read_parquet(run / "chain" / step / "eval" / "samples" / "post.parquet")
        size = post[post.task == f"step:{step}"].problem_id.nunique()
        out[f"step:{step}"] = 2 * (0.25 / (size * (1 if h.get("grader") == "fact" else n))) ** 0.5
    sizes = [len(pd.read_parquet(s["path"])) * n for s in params["data"]["old_suites"].values()
             if s.get("grader", "math") != "perplexity"]
    out["old_task"] = 2 * (sum(0.25 / m for m in sizes) / len(sizes) ** 2) ** 0.5
    return out


def write_chain_summary(run: Path, params: dict, steps: list[str], head: dict) -> None:
    """summary.json: per method the last step's metrics and R (rows post, steps; columns the steps' tasks), whether
    the KFAC chain keeps step 1's task better than sequential SFT and SFT + merge (exactly and beyond the noise
    margin), and the broken items per method (broken_items.parquet)."""
    last = steps[-1]
    metrics = json.loads((run / "chain" / last / "metrics.json").read_text())["chain"]
    matrix = pd.read_parquet(run / "chain" / last / "matrix.parquet")
    margin = chain_margins(run, params, steps)
    r = {m: [[None if v != v else v for v in sub[sub.row == i].sort_values("column")["pass@1"].tolist()]
             for i in sorted(sub.row.unique())] for m, sub in matrix.groupby("method")}
    kept = {}
    first = steps[0]
    final = {m: r[m][-1][0] for m in r}
    for rival in ("sft", "sft_merge"):
        if len(steps) > 1:
            diff = final["graft_kfac"] - final[rival]
            kept[f"graft_kfac keeps step {first} better than {rival}"] = {
                "difference": diff, "exact": diff > 0, "beyond_noise": diff > margin[f"step:{first}"]}
    broken = chain_broken_items(run, steps)
    broken.to_parquet(run / "broken_items.parquet", index=False)
    geometry = pd.read_parquet(run / "chain" / last / "geometry.parquet").to_dict("records")
    summary = {**head, "steps": steps, "metrics": metrics, "R": r, "margins": margin, "checks": kept,
               "geometry": geometry,
               "broken_per_method": broken.groupby(["method", "task"]).size().unstack(fill_value=0).to_dict("index")
               if len(broken) else {}}
    (run / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")


def scenario_overlay(scenario: str) -> dict:
    """research/real/<scenario>.yaml's keys; a file with ``extends: <other>`` is <other>'s keys with its own replaced
    (a cut-down run of a scenario names what it changes, nothing more)."""
    over = yaml.safe_load((Path(__file__).resolve().parent / "real" / f"{scenario}.yaml").read_text())
    parent = over.pop("extends", None)
    return overlay(scenario_overlay(parent), over) if parent else over


def scenario_params(committed: str, scenario: str, seed: int) -> dict:
    params = overlay(yaml.safe_load(committed), scenario_overlay(scenario))
    params["knowledge"]["seed"] = seed   # the invented fact world
    if params["finetune"]["source"] != "knowledge":
        # a mined scenario: which problems are held out as the new task, and mining's own samples
        params["mine"]["seed"] = seed
    return params


def put_back(runs: list[str]) -> int:
    """Copy earlier runs' point records and samples into reports/ (evaluate checks each record's key and samples hash,
    so a stale one is rescored, never trusted; a later run's record of a name wins). Returns how many were put back."""
    n = 0
    for name in runs:
        src = OUT / name
        if not src.is_dir():
            raise SystemExit(f"--reuse {name}: no run folder {src} (names look like hard_short-seed0)")
        if not (src / "points").is_dir():
            raise SystemExit(f"--reuse {name}: {src}/points does not exist (runs before 2026-12-04 kept no records)")
        for rec in sorted((src / "points").glob("*.json")):
            samples = src / "samples" / f"{rec.stem}.parquet"
            if samples.exists():
                POINTS.mkdir(parents=True, exist_ok=True)
                SAMPLES.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(samples, SAMPLES / samples.name)
                shutil.copyfile(rec, POINTS / rec.name)
                n += 1
    return n


def repro(cmd: list[str], log) -> int:
    """Run ``cmd`` (``dvc repro``) writing to ``log`` and return its exit status. It gets a process group of its own, so
    that SIGTERM or Ctrl-C to this script reaches dvc and the stage it runs as one Ctrl-C (dvc then stops the stage and
    releases its locks); this script then ends with SystemExit(128 + signal) once they have. Python's default SIGTERM
    would end it at once, without main's ``finally``, leaving the scenario's params.yaml and dvc.lock in the workspace."""
    proc: subprocess.Popen | None = None
    received: list[int] = []

    def stop(signum, _frame):
        received.append(signum)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if received:   # a signal that came while it started (stop saw no process yet)
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise SystemExit(128 + received[0])
    return code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", nargs="?", help="research/real/<scenario>.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse", nargs="*", default=[], metavar="RUN",
                    help="earlier runs (research/real/<RUN>) whose scored points evaluate may keep")
    ap.add_argument("--summarise", action="store_true", help="only rebuild summary.json from the run's folder")
    ap.add_argument("--checks-over", nargs="+", metavar="RUN",
                    help="only print the paper checks over these run folders' points pooled (one scenario and seed)")
    args = ap.parse_args()
    if args.checks_over:
        points, margin, apart = pooled_points(args.checks_over)
        print(json.dumps({"runs": args.checks_over, "points": len(points), "margin": margin, "kept_apart": apart,
                          "paper_checks": paper_checks(points, margin)}, indent=2, sort_keys=True))
        return
    if args.scenario is None:
        ap.error("a scenario is needed (or --checks-over)")
    if args.summarise:
        run = OUT / f"{args.scenario}-seed{args.seed}"
        params = yaml.safe_load((run / "params.yaml").read_text())
        head = json.loads((run / "summary.json").read_text())
        write_summary(run, params, {k: head[k] for k in ("scenario", "seed", "wall_s")})
        return
    committed = Path("params.yaml").read_text()
    params = scenario_params(committed, args.scenario, args.seed)
    run = OUT / f"{args.scenario}-seed{args.seed}"
    lock = Path("dvc.lock").read_text()
    t0 = time.time()
    reused = put_back(args.reuse)
    if args.reuse:
        print(f"put back {reused} scored points from {', '.join(args.reuse)}")
    try:
        Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        log = Path(".graft/real_model.log")   # the run's progress, to follow with tail -f (not an output)
        log.parent.mkdir(exist_ok=True)
        steps = list(params.get("chain", {}).get("steps", {}))
        # a chain scenario runs the chain up to its last step (and the data stages it reads), not the single sweep
        target = [f"chain_report@{steps[-1]}"] if steps else []
        with log.open("w") as f:
            returncode = repro(["dvc", "repro", *target], f)
        wall = time.time() - t0
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        (run / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        if returncode != 0:
            (run / "failed.txt").write_text(log.read_text()[-6000:])
            raise SystemExit(f"{run}: dvc repro failed after {wall:.0f} s (failed.txt)")
        if steps:
            copy_chain(run, steps)
            write_chain_summary(run, params, steps, {"scenario": args.scenario, "seed": args.seed,
                                                     "wall_s": round(wall)})
        else:
            copy_reports(run, params)
            shutil.copytree(SAMPLES, run / "samples")
            shutil.copytree(POINTS, run / "points")   # the records --reuse puts back (key, metrics, samples hash)
            write_summary(run, params, {"scenario": args.scenario, "seed": args.seed, "wall_s": round(wall)})
        print(f"{run}: done in {wall:.0f} s")
    finally:
        Path("params.yaml").write_text(committed)
        Path("dvc.lock").write_text(lock)
        subprocess.run(["dvc", "checkout", "--quiet"], check=False)


if __name__ == "__main__":
    main()
