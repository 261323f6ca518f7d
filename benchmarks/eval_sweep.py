"""Evaluating a lambda sweep: one engine per point vs the shared engine, and vLLM vs HF tokens per second.

    python benchmarks/eval_sweep.py            (after `dvc repro`; reads the default world's graft delta)
    python -m benchmarks.eval_sweep --row      (part 1 only, as one JSON line: the suite's sweep row)

1. A 6-point lambda sweep of post + lam * graft delta, evaluated exactly as the evaluate stage does (same tables,
   sampling and grading), two ways in one run:
   - per point: write the merged model directory, start a vLLM engine on it, evaluate, stop it;
   - shared:    start one engine on the post model, write each point's weights into it, evaluate.
   Prints the wall time of each and their ratio, and checks that both give the same samples.
2. The post model's evaluation set generated with each backend: generated tokens per second of generation time
   (engine start excluded, printed apart).
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from graft.evaluation import evaluate_model, evaluation_suites
from graft.generation import HFGenerator, VLLMGenerator
from graft.merging import merge_into_dir
from graft.points import POINT_LOADER
from graft.schema import load_all

LAMS = [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]


def measure_sweep() -> dict:
    """The 6-point sweep both ways (part 1); the wall times, the engine start, whether the samples agree, and what
    part 2 needs."""
    p = load_all()
    ev, gen, models = p["evaluate"], p["generation"], p["models"]
    run = f"lr{p['finetune'].lrs[0]}_ep{p['sweep'].epochs[0]}"
    delta = Path(f"tensors/delta/graft_{run}")
    if not delta.is_dir():
        raise SystemExit(f"{delta} is missing: run `dvc repro` first")
    new_task, suites, _ = evaluation_suites(p)
    fmt = new_task.fmt

    def vllm(model_dir) -> VLLMGenerator:
        return VLLMGenerator(model_dir, fmt.stop_ids, gen.dtype, gen.max_model_len, gen.vllm_memory_fraction,
                             gen.vllm_enforce_eager, worker_extension=POINT_LOADER)

    def score(g):
        metrics, samples = evaluate_model(g, new_task, suites, ev.pass_k)
        return metrics["new_task"], metrics["old_task"], samples

    # 1a. one engine per point
    per_point, t0 = {}, time.perf_counter()
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for lam in LAMS:
            out = Path(tmp) / f"lam{lam}"
            out.mkdir()
            merge_into_dir(models.post, delta, lam, out)
            g = vllm(out)
            per_point[lam] = score(g)
            g.close()
            shutil.rmtree(out)
    per_point_s = time.perf_counter() - t0

    # 1b. the shared engine
    shared, t0 = {}, time.perf_counter()
    g = vllm(models.post)
    start_s = time.perf_counter() - t0
    for lam in LAMS:
        g.load_point(models.post, delta, lam)
        shared[lam] = score(g)
    g.close()
    shared_s = time.perf_counter() - t0

    same = all(per_point[lam][2].equals(shared[lam][2]) for lam in LAMS)
    return {"per_point_s": per_point_s, "shared_s": shared_s, "start_s": start_s, "same": same, "shared": shared,
            "problems": (len(new_task.problems), sum(len(s.problems) for s in suites.values())),
            "n_samples": ev.n_samples, "vllm": vllm, "score": score, "p": p, "fmt": fmt}


def main() -> None:
    import sys

    m = measure_sweep()
    if sys.argv[1:] == ["--row"]:   # the suite's row, in a fresh process: the suite's own heap (the 1B parts) once
        # left the in-process vLLM engine too little memory for its KV cache
        print(json.dumps({"sweep": {k: m[k] for k in ("per_point_s", "shared_s", "start_s", "same")}}), flush=True)
        return
    per_point_s, shared_s, start_s, same, shared = (m[k] for k in ("per_point_s", "shared_s", "start_s", "same",
                                                                    "shared"))
    vllm, score, fmt, gen, models = m["vllm"], m["score"], m["fmt"], m["p"]["generation"], m["p"]["models"]
    new_n, old_n = m["problems"]
    print(f"{len(LAMS)}-point lambda sweep ({new_n} new-task problems + {old_n} old-task problems, "
          f"n={m['n_samples']} each):")
    print(f"  one engine per point: {per_point_s:.1f} s   shared engine: {shared_s:.1f} s (engine start "
          f"{start_s:.1f} s once)   ratio {per_point_s / shared_s:.2f}x   identical samples: {same}")
    for lam in LAMS:
        print(f"  lam {lam}: new {shared[lam][0]:.3f} old {shared[lam][1]:.3f}")

    # 2. tokens per second on the post model
    rates = {}
    for name, make in (("vllm", lambda: vllm(models.post)),
                       ("hf", lambda: HFGenerator(models.post, fmt.stop_ids, fmt.pad_id, gen.dtype, gen.batch_size))):
        t0 = time.perf_counter()
        g = make()
        t1 = time.perf_counter()
        _, _, samples = score(g)
        t2 = time.perf_counter()
        g.close()
        tokens = int(samples.n_tokens.sum())
        rates[name] = tokens / (t2 - t1)
        print(f"{name}: start {t1 - t0:.1f} s, {tokens} tokens in {t2 - t1:.1f} s = {rates[name]:.0f} tokens/s")
    print(f"vllm / hf tokens per second: {rates['vllm'] / rates['hf']:.2f}x")


if __name__ == "__main__":
    main()
