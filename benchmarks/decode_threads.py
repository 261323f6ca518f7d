"""The HF sampling loop on SmolLM2-135M at a given number of torch threads (BENCHMARKS.md, 2026-12-05): run it alone
and beside other work, one fresh process per timing.

    python -m benchmarks.decode_threads ROWS NEW_TOKENS THREADS     # prints {"rows", "tokens", "threads", "seconds"}
"""
from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import graft  # noqa: F401  the stages' OpenMP wait policy, before torch
    import torch

    from benchmarks.sizes import smollm2
    from graft.generation import HFGenerator, SamplingSpec
    from graft.modeling import load_model, load_tokenizer

    rows, tokens, threads = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(threads)
    model_dir = smollm2().post
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    gen = HFGenerator.from_model(model, tok, [-1], 0, batch_size=rows)   # no stop id: every row runs to the end
    prompt = tok("Tell me a story about a cat and a dog who", add_special_tokens=False)["input_ids"]

    def batch() -> list:
        return [(prompt, torch.Generator().manual_seed(i)) for i in range(rows)]

    gen.generate_rows(batch(), SamplingSpec(1, 1.0, 1.0, 2, 0))   # warm-up
    t0 = time.perf_counter()
    gen.generate_rows(batch(), SamplingSpec(1, 1.0, 1.0, tokens, 0))
    print(json.dumps({"rows": rows, "tokens": tokens, "threads": threads,
                      "seconds": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
