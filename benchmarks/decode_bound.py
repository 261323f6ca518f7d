"""Where an OPSD step's sampling goes: a decoding step of the HF sampling loop (batch 4, 96 tokens, fp32) and one bare
decoding forward with the cache, against one read of every weight (a decoding step reads each weight once).

    python -m benchmarks.decode_bound [MODEL_DIR]      (default: the suite's SmolLM2-135M, .graft/bench/smollm2)
"""
from __future__ import annotations

import sys


def main() -> None:
    import graft  # noqa: F401  the stages' OpenMP wait policy, before torch
    import torch

    from benchmarks.common import timed
    from benchmarks.sizes import smollm2
    from graft.generation import HFGenerator, SamplingSpec
    from graft.modeling import load_model, load_tokenizer

    model_dir = sys.argv[1] if len(sys.argv) > 1 else smollm2().post
    torch.manual_seed(0)
    model, tok = load_model(model_dir, "float32"), load_tokenizer(model_dir)
    model.eval()
    params = list(model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params)

    def median(fn, n: int) -> float:
        return sorted(timed(fn)[0] for _ in range(n))[n // 2]

    read = lambda: [float(p.sum()) for p in params]   # noqa: E731
    read()   # warm-up
    read_s = median(read, 5)
    print(f"weights {nbytes / 1e6:.0f} MB; one read of every weight: median {read_s * 1e3:.1f} ms "
          f"({nbytes / read_s / 1e9:.1f} GB/s)")

    gen = HFGenerator.from_model(model, tok, [tok.eos_token_id], tok.pad_token_id or 0, batch_size=4)
    prompts = [tok.encode("Question: what is 17 times 23? Show the steps.")[:30]] * 4
    spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, max_new_tokens=96, seed=0)
    for _ in range(3):
        rows = [(p, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts)]
        with torch.no_grad():
            seconds, out = timed(lambda: gen.generate_rows(rows, spec))
        steps = max(len(o) for o in out)
        print(f"generate 4 rows: {seconds:.2f} s for {steps} steps: {seconds / steps * 1e3:.1f} ms a step")

    # one decoding forward alone (the cache grows by one token a call), without the sampling loop's Python
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([prompts[0] + list(range(100, 130))] * 4), use_cache=True).past_key_values
        nxt = torch.full((4, 1), 200)
        forward_s = median(lambda: model(input_ids=nxt, past_key_values=cache, use_cache=True), 21)
    print(f"one decoding forward (batch 4): median {forward_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
