"""Benchmark: peak memory of the KFAC estimate against the model size, all layers in one pass vs one layer per pass.

Random Qwen3-shaped models of one width at two depths (nothing is downloaded); each run is a fresh process that
estimates and writes the KFAC factors of every block linear layer (graft.kfac.write_kfac, as the fisher stage does)
on 8 rollouts of 64 tokens, and reports its peak resident memory. With one layer per pass the peak should grow with
the model's weights only, not with the factors of every layer.
Run: python benchmarks/kfac_memory.py
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = {"hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 64, "vocab_size": 4096}


def child(layers: int, per_pass: int) -> None:
    import random

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sys.path.insert(0, str(ROOT))
    from graft.kfac import kfac_linear_names, write_kfac

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=layers, **WIDTH)).float()
    rng = random.Random(0)
    rollouts = [([rng.randrange(4096) for _ in range(16)], [rng.randrange(4096) for _ in range(48)])
                for _ in range(8)]
    names = kfac_linear_names(model)
    mods = dict(model.named_modules())
    factor_bytes = sum(4 * (mods[n].in_features ** 2 + mods[n].out_features ** 2) for n in names)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        write_kfac(model, names, rollouts, 0, 4, None, per_pass, Path(d) / "kfac.safetensors")
    print(json.dumps({"layers": layers, "per_pass": per_pass, "seconds": round(time.perf_counter() - t0, 2),
                      "params_mb": round(sum(p.numel() for p in model.parameters()) * 4 / 2**20, 1),
                      "factors_mb": round(factor_bytes / 2**20, 1),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def main() -> None:
    rows = []
    for layers in (4, 16):
        for per_pass in (0, 1):
            r = subprocess.run([sys.executable, __file__, "--child", str(layers), str(per_pass)],
                               capture_output=True, text=True, check=True)
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    print("\n| layers | fp32 weights MB | all factors MB | layers per pass | peak RSS MB | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layers']} | {r['params_mb']} | {r['factors_mb']} | {r['per_pass'] or 'all'} | "
              f"{r['peak_rss_mb']} | {r['seconds']} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
