"""One streaming read of safetensors files in a fresh process: every tensor's bytes brought into memory once, one
tensor at a time (the mask benchmark's reference: a process that reads what the mask stage reads and does nothing
else), and ``touch``, the read itself, which the I/O floors share.

    python -m benchmarks.read_tensors PATH...
"""
from __future__ import annotations

import sys


def touch(t) -> int:
    """Reads a tensor's bytes, nothing more, and returns its element count: the largest byte, a reduction that reads
    every byte once and writes nothing (a copy into a buffer also writes, 5x the time of this on a 135M Fisher here).
    safetensors maps a file's tensors lazily (0.8 here), so taking a tensor from a file reads nothing until its bytes
    are used: until 2026-12-06 the suite's reads and its merge floor's delta only took the tensors, and measured
    start-up and headers."""
    import torch

    if t.numel():   # an empty tensor has no bytes (and no largest one)
        t.reshape(-1).view(torch.uint8).max()
    return t.numel()


def main() -> None:
    import graft  # noqa: F401  the same start-up as a stage (OpenMP policy, then torch)
    from graft.tensors import TensorReader

    total = 0
    for path in sys.argv[1:]:
        with TensorReader(path) as r:
            for name in r.names():
                total += touch(r.get(name))
    print(total)


if __name__ == "__main__":
    main()
