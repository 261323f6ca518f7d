"""One streaming read of safetensors files in a fresh process: every tensor brought into memory once, one at a time
(the mask benchmark's reference: a process that reads what the mask stage reads and does nothing else).

    python -m benchmarks.read_tensors [--skip-factors] PATH...
"""
from __future__ import annotations

import sys


def main() -> None:
    import graft  # noqa: F401  the same start-up as a stage (OpenMP policy, then torch)
    from graft.tensors import TensorReader

    args = sys.argv[1:]
    skip = "--skip-factors" in args   # the mask reads the KFAC eigenbases, never the factors P and Q themselves
    total = 0
    for path in [a for a in args if a != "--skip-factors"]:
        with TensorReader(path) as r:
            for name in r.names():
                if not (skip and name.endswith((".P", ".Q"))):
                    total += r.get(name).numel()
    print(total)


if __name__ == "__main__":
    main()
