"""One heavy piece of a stage, timed in a fresh process (so that its OpenMP environment applies), or a load that
runs until it is killed (a second pipeline's stage). Prints one JSON line: the seconds of the timed part.

    python -m benchmarks.load_work eig|fisher|train|mask|generate MODEL_DIR [WORK_DIR]
    python -m benchmarks.load_work loop-train|loop-generate MODEL_DIR
"""
from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import graft  # noqa: F401  the stages' OpenMP wait policy, before torch (unless the caller's env sets one)
    import torch

    work, model_dir = sys.argv[1], sys.argv[2]
    from graft.modeling import load_model

    if work in ("loop-generate", "generate"):
        from vllm import LLM, SamplingParams

        from graft.generation import engine_layout

        # the engine layout the stages use (the environment may override it)
        llm = LLM(model=model_dir, dtype="float32", max_model_len=512, gpu_memory_utilization=0.2,
                  enforce_eager=True, seed=0, **engine_layout(1))
        sp = SamplingParams(n=1, temperature=1.0, max_tokens=64, seed=0, ignore_eos=True)
        prompts = ["Tell me a story about a cat."] * 32
        if work == "loop-generate":
            print(json.dumps({"ready": True}), flush=True)
            while True:
                llm.generate(prompts, sp, use_tqdm=False)
        llm.generate(prompts[:2], sp, use_tqdm=False)
        t0 = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
        return
    if work == "eig":   # the KFAC stage's eigendecompositions at SmolLM2's widths (3 x 1536 + 6 x 576, fp64)
        from graft.kfac import eigh_factor

        g = torch.Generator().manual_seed(0)
        mats = [(lambda a: a @ a.T)(torch.randn(n, n, generator=g)) for n in [1536] * 3 + [576] * 6]
        t0 = time.perf_counter()
        for m in mats:
            eigh_factor(m)
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
        return
    if work == "mask":   # the mask stage in the sandbox the benchmark made (start-up included)
        import subprocess

        from benchmarks.tensor_rows import EPOCH, LR, RHO, REPO
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "stages.mask", "--kind", "diagonal", "--rho", str(RHO), "--lr",
                            str(LR), "--epoch", str(EPOCH)], cwd=sys.argv[3], env={**__import__("os").environ,
                                                                                   "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(r.stderr[-2000:])
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
        return
    model = load_model(model_dir)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    if work == "fisher":   # the diagonal Fisher of 2 rollouts of 128 tokens
        from graft.fisher import estimate_diag_fisher

        ids = torch.randint(3, vocab, (2, 128), generator=g).tolist()
        rolls = [(r[:32], r[32:]) for r in ids]
        t0 = time.perf_counter()
        estimate_diag_fisher(model, rolls, 0, 2)
        print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
        return
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(3, vocab, (4, 96), generator=g)

    def step() -> None:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if work == "loop-train":
        print(json.dumps({"ready": True}), flush=True)
        while True:
            step()
    t0 = time.perf_counter()
    step()
    print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main()
