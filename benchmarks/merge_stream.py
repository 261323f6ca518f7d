"""Benchmark: our streaming merge vs a plain copy of the same bytes, and its peak memory.

Builds a synthetic bf16 checkpoint (default ~400 MB in 4 shards), then times in one run:
  copy:   read every tensor of post + delta and write post's bytes unchanged (the floor: same I/O, no math)
  merge:  merge_into_dir (fp32 math, bf16 out)
and prints the time ratio and the peak private memory of each. Run: python benchmarks/merge_stream.py [size_mb]
"""
from __future__ import annotations

import threading
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.merging import merge_into_dir  # noqa: E402
from graft.tensors import TensorReader, dtype_of, save_tensors, write_safetensors_streamed  # noqa: E402


class PrivatePeak:
    """Peak anonymous (private) memory while a block runs, sampled from /proc every 5 ms. RSS would count the
    file pages that safetensors maps lazily, which are not memory the merge holds."""

    def __init__(self) -> None:
        self.peak = 0.0

    @staticmethod
    def now() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def __enter__(self) -> "PrivatePeak":
        self.base, self.peak, self.stop = self.now(), 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.now() - self.base)
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


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

    out = tmp / "copy"
    out.mkdir()
    with PrivatePeak() as mem_copy:
        t0 = time.perf_counter()
        with TensorReader(post) as p, TensorReader(delta_path) as d:
            for shard, ns in p.shards().items():
                write_safetensors_streamed(out / shard, [(n, dtype_of(p, n), p.shape(n)) for n in ns],
                                           lambda n: (d.get(n).sum(), p.get(n))[1])  # touch the delta too
        t_copy = time.perf_counter() - t0
    out = tmp / "merged"
    out.mkdir()
    with PrivatePeak() as mem_merge:
        t0 = time.perf_counter()
        merge_into_dir(post, delta_path, 0.5, out)
        t_merge = time.perf_counter() - t0
    total = sum(f.stat().st_size for f in post.glob("*.safetensors")) / 2**20
    print(f"checkpoint {total:.0f} MB bf16 in {shards} shards + fp32 delta")
    print(f"plain copy (same reads and writes, no math): {t_copy:.2f} s")
    print(f"streaming merge (fp32 math, bf16 out):       {t_merge:.2f} s  ratio {t_merge / t_copy:.2f}x")
    print(f"peak private memory: copy {mem_copy.peak:.0f} MB, merge {mem_merge.peak:.0f} MB "
          f"(one tensor: {side * side * 2 / 2**20:.1f} MB bf16, {side * side * 4 / 2**20:.1f} MB fp32)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
