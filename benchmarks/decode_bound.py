"""Where an OPSD step's sampling goes: a decoding step of the HF sampling loop (batch 4, 96 tokens, fp32) and one bare
decoding forward with the cache, against one read of every weight (a decoding step reads each weight once).

    python -m benchmarks.decode_bound MODEL_DIR      (e.g. .graft/bench/smollm2, which the suite builds)
"""
import sys
import time

import torch

import graft  # noqa: F401  the stages' start-up (OpenMP policy, then torch)
from graft.modeling import load_model, load_tokenizer
from graft.generation import HFGenerator, SamplingSpec
d = sys.argv[1]
torch.manual_seed(0)
model = load_model(d, "float32"); model.eval()
tok = load_tokenizer(d)
params = list(model.parameters())
nbytes = sum(p.numel() * p.element_size() for p in params)
def read_all():
    s = 0.0
    for p in params: s += float(p.sum())
    return s
read_all()
t = []
for _ in range(5):
    t0 = time.perf_counter(); read_all(); t.append(time.perf_counter() - t0)
print(f"weights {nbytes/1e6:.0f} MB; one read of every weight: median {sorted(t)[2]*1e3:.1f} ms ({nbytes/sorted(t)[2]/1e9:.1f} GB/s)")
gen = HFGenerator.from_model(model, tok, [tok.eos_token_id], tok.pad_token_id or 0, batch_size=4)
prompts = [tok.encode("Question: what is 17 times 23? Show the steps.")[:30]] * 4
spec = SamplingSpec(n=1, temperature=1.0, top_p=1.0, max_new_tokens=96, seed=0)
for rep in range(3):
    rows = [(p, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    with torch.no_grad():
        out = gen.generate_rows(rows, spec)
    dt = time.perf_counter() - t0
    n = max(len(o) for o in out)
    print(f"generate 4 rows: {dt:.2f} s for {n} steps: {dt/n*1e3:.1f} ms a step")
# one decode forward alone (cache of 60 tokens), without the sampling loop's Python
ids = torch.tensor([prompts[0] + list(range(100, 130))] * 4)
with torch.no_grad():
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    nxt = torch.full((4, 1), 200)
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        model(input_ids=nxt, past_key_values=cache, use_cache=True)
        ts.append(time.perf_counter() - t0)
print(f"one decoding forward (batch 4): median {sorted(ts)[10]*1e3:.1f} ms")
