"""The benchmark suite: every goal of the performance issue as a ratio of two times measured in the same run.

    python -m benchmarks                      # everything: 135m and 1b sizes, load, sweep, pipeline (about an hour)
    python -m benchmarks --sizes 135m --skip pipeline load
    python -m benchmarks --dry-run            # the toy model only, every row that runs at that size (seconds)

Writes benchmarks/results.json (rows, machine, load average during the run) and prints the BENCHMARKS.md table.
mergekit runs from its own environment: ./benchmarks/setup_mergekit.sh first (its row says so otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from benchmarks.common import LoadSampler, Row, machine, markdown

PARTS = ("fisher", "mask", "merge", "mergekit", "opsd", "sweep", "load", "pipeline")


def _stopped(signum, frame) -> None:
    # a stopped suite unwinds (KeyboardInterrupt is not a part's failure), so each part's finally stops the second
    # pipeline it started (a vLLM engine and its worker outlive a killed parent otherwise) and removes its sandbox
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    signal.signal(signal.SIGTERM, _stopped)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["135m", "1b"], choices=["toy", "135m", "1b"])
    ap.add_argument("--skip", nargs="*", default=[], choices=PARTS)
    ap.add_argument("--dry-run", action="store_true", help="the toy model only; no sweep, load or pipeline rows")
    ap.add_argument("--out", default="benchmarks/results.json")
    from benchmarks.load_rows import DEFAULT_POLICIES, LOADS, POLICIES, WORKS
    ap.add_argument("--load-policies", nargs="+", default=list(DEFAULT_POLICIES), choices=list(POLICIES),
                    help="the load rows' environments (default: the stages' own and libgomp's default wait)")
    ap.add_argument("--load-kinds", nargs="+", default=list(LOADS), choices=list(LOADS), help="the second pipelines")
    ap.add_argument("--load-works", nargs="+", default=list(WORKS), choices=list(WORKS), help="the measured pieces")
    ap.add_argument("--work", default=".graft/bench", help="where models and inputs are built (git-ignored)")
    args = ap.parse_args()
    sizes, skip = (["toy"], set(args.skip) | {"sweep", "load", "pipeline", "mergekit"}) if args.dry_run else \
        (args.sizes, set(args.skip))
    from benchmarks import sizes as S

    S.set_root(args.work)
    rows: list[Row] = []
    started = time.perf_counter()

    def save(complete: bool) -> dict:
        # written after every row: a part that fails or a run that is stopped keeps what was measured
        result = {"machine": machine(), "load_average": load.summary(),
                  "wall_s": round(time.perf_counter() - started, 1), "argv": {"sizes": sizes, "skip": sorted(skip),
                                                                      "load": [args.load_policies, args.load_kinds,
                                                                               args.load_works]},
                  "complete": complete,
                  "rows": [r.as_dict() for r in rows]}
        tmp = Path(f"{args.out}.tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
        return result

    def add(new: list[Row]) -> None:
        for r in new:
            rows.append(r)
            print(json.dumps(r.as_dict()), flush=True)
        save(False)

    def guarded(what: str, size: str, fn) -> list[Row]:
        """One part's rows; its failure is a row saying why, and the suite goes on."""
        try:
            return fn()
        except (Exception, SystemExit) as e:   # noqa: BLE001 - any failure of a part is reported, not fatal
            text = str(e).strip()
            why = text.splitlines()[-1][:300] if text else repr(e)
            return [Row(what, size, "", None, None, "", note=f"failed: {why}")]

    def part(what: str, size: str, fn) -> None:
        add(guarded(what, size, fn))

    def sweep_rows() -> list[Row]:
        import subprocess
        import sys

        from benchmarks.common import json_line

        # a fresh process where the suite runs (a workspace with the default outputs): the suite's own heap after
        # the 1B parts left the in-process vLLM engine too little memory for its KV cache (2026-12-06)
        r = subprocess.run([sys.executable, "-m", "benchmarks.eval_sweep", "--row"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        found = json_line(r.stdout, "sweep")
        if r.returncode or found is None:
            raise SystemExit(f"eval_sweep --row failed (exit {r.returncode}): {(r.stderr or r.stdout)[-600:]}")
        m = found["sweep"]
        return [Row("evaluating a 6-point sweep", "toy", "one engine per point", m["shared_s"], m["per_point_s"],
                    ">= 3x", note=f"shared engine (start {m['start_s']:.1f} s once); identical samples: {m['same']}")]

    def sweep_in(clone: Path) -> list[Row]:
        here = os.getcwd()
        os.chdir(clone)   # measure_sweep reads params.yaml and the default outputs where it runs
        try:
            return guarded("evaluating a 6-point sweep", "toy", sweep_rows)
        finally:
            os.chdir(here)

    with LoadSampler() as load:
        for name in sizes:
            size = S.SIZES[name]()
            eigen = None
            if "fisher" not in skip:
                from benchmarks.fisher_rows import fisher_rows

                def fisher_part():
                    nonlocal eigen
                    new, eigen = fisher_rows(size, check=name != "1b")
                    return new
                part("Fisher rows", name, fisher_part)
            if not {"mask", "merge"} <= skip:
                ft, delta = S.finetuned_and_delta(size)
                if "mask" not in skip:
                    from benchmarks.tensor_rows import mask_rows

                    part("mask rows", name, lambda: mask_rows(size, delta, S.diagonal_fisher(size, delta),
                                                              S.kfac_file(size, delta, eigen)))
                if "merge" not in skip:
                    from benchmarks.tensor_rows import merge_rows

                    part("merge rows", name, lambda: merge_rows(size, ft, delta, mergekit="mergekit" not in skip))
            if "opsd" not in skip and name in ("toy", "135m"):
                from benchmarks.step_rows import opsd_row

                part("OPSD step", name, lambda: [opsd_row(size)])
        if "load" not in skip:
            from benchmarks.load_rows import load_rows

            measured = load_rows(tuple(args.load_policies), tuple(args.load_kinds), tuple(args.load_works))
            while (batch := guarded("load rows", "135m", lambda: next(measured, None))) is not None:
                add(batch)
                if batch and batch[0].note.startswith("failed"):
                    break
        if "pipeline" not in skip:
            from benchmarks.pipeline_rows import pipeline_rows

            # the sweep runs on the pipeline clone's default outputs (a fresh workspace has none)
            part("pipeline rows", "toy", lambda: pipeline_rows(sweep_in if "sweep" not in skip else None))
        elif "sweep" not in skip:
            part("evaluating a 6-point sweep", "toy", sweep_rows)
    result = save(True)
    print(f"\n{markdown(result['rows'])}\n\nmachine: {result['machine']}\nload average during the run: "
          f"{result['load_average']}\nwall time {result['wall_s']} s; written to {args.out}")


if __name__ == "__main__":
    main()
