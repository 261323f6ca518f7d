"""Benchmark: our streaming merge vs a plain copy of the same bytes, and its peak memory.

Builds a synthetic bf16 checkpoint (default ~400 MB in 4 shards), then times in one run:
  copy:   read every tensor of post + delta and write post's bytes unchanged (the floor: same I/O, no math)
  merge:  merge_into_dir (fp32 math, bf16 out)
and prints the ratio and the peak RSS growth of each. Run: python benchmarks/merge_stream.py [size_mb]
"""
from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.merging import merge_into_dir  # noqa: E402
from graft.tensors import TensorReader, dtype_of, save_tensors, write_safetensors_streamed  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(size_mb: int = 400) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="graft-bench-"))
    post = tmp / "post"
    post.mkdir()
    n_tensors, per = 64, size_mb * 2**20 // 64 // 2  # bf16 elements per tensor
    side = int(per ** 0.5)
    g = torch.Generator().manual_seed(0)
    names = [f"model.layers.{i}.w.weight" for i in range(n_tensors)]
    shards = 4
    weight_map = {}
    for s in range(shards):
        chunk = {n: torch.randn(side, side, generator=g).to(torch.bfloat16) for n in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_tensors(post / fname, chunk)
        weight_map.update({n: fname for n in chunk})
    import json

    (post / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (post / "config.json").write_text("{}")
    delta_path = tmp / "delta.safetensors"
    write_safetensors_streamed(delta_path, [(n, torch.float32, [side, side]) for n in names],
                               lambda n: torch.randn(side, side, generator=g) * 1e-3)

    base_peak = peak_mb()
    t0 = time.perf_counter()
    out = tmp / "copy"
    out.mkdir()
    with TensorReader(post) as p, TensorReader(delta_path) as d:
        for shard, ns in p.shards().items():
            write_safetensors_streamed(out / shard, [(n, dtype_of(p, n), p.shape(n)) for n in ns],
                                       lambda n: (d.get(n), p.get(n))[1])
    t_copy = time.perf_counter() - t0
    peak_copy = peak_mb() - base_peak
    t0 = time.perf_counter()
    out = tmp / "merged"
    out.mkdir()
    merge_into_dir(post, delta_path, 0.5, out)
    t_merge = time.perf_counter() - t0
    peak_merge = peak_mb() - base_peak
    total = sum(f.stat().st_size for f in post.glob("*.safetensors")) / 2**20
    print(f"checkpoint {total:.0f} MB bf16 in {shards} shards + fp32 delta")
    print(f"plain copy (same reads and writes, no math): {t_copy:.2f} s")
    print(f"streaming merge (fp32 math, bf16 out):       {t_merge:.2f} s  ratio {t_merge / t_copy:.2f}x")
    print(f"peak RSS growth: copy {peak_copy:.0f} MB, merge {max(peak_merge, peak_copy):.0f} MB "
          f"(largest tensor {side * side * 4 / 2**20:.1f} MB fp32)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
