"""One merge in a fresh process, so its memory is its own: prints the private memory after start-up (torch loaded)
and the merge's wall time.

    python -m benchmarks.merge_once POST DELTA LAM OUT
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    import graft  # noqa: F401
    from benchmarks.common import rss_anon_mb
    from graft.merging import merge_into_dir

    post, delta, lam, out = sys.argv[1:5]
    base = rss_anon_mb()
    Path(out).mkdir(parents=True)
    t0 = time.perf_counter()
    merge_into_dir(post, delta, float(lam), out)
    print(json.dumps({"seconds": time.perf_counter() - t0, "baseline_mb": base}), flush=True)


if __name__ == "__main__":
    main()
