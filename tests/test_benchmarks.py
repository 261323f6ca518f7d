"""The benchmark suite cannot rot: its dry run (`python -m benchmarks --dry-run`, the toy model) produces every row
that runs at that size, with both times measured, and writes results.json. No time is asserted (BENCHMARKS.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_benchmark_dry_run_writes_every_row(tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--dry-run", "--out", str(out), "--work",
                        str(tmp_path / "bench")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {row["what"]: row for row in result["rows"]}
    assert {"diagonal Fisher, per rollout", "diagonal Fisher vs the naive per-rollout reference",
            "KFAC factors, per rollout", "KFAC eigendecompositions",
            "exact global top-rho mask (diagonal), whole stage", "exact global top-rho mask (kfac), whole stage",
            "KFAC mask against its own arithmetic", "merge / export of post + lam * M(delta)",
            "OPSD step"} <= set(rows)
    for row in rows.values():
        # a diagnostic row (no goal) says nothing met or missed
        assert row["met"] in ((True, False) if row["goal"] else (None,)) and row["reference"] > 0, row
        if row["unit"] == "s":
            assert row["measured"] > 0 and row["ratio"] > 0, row
    # the vmapped diagonal Fisher equals one backward per rollout (a correctness row, not a speed one)
    assert rows["diagonal Fisher vs the naive per-rollout reference"]["met"]
    assert result["machine"]["cores"] >= 1 and result["load_average"]["samples"] >= 1
    assert "| what | size | measured |" in r.stdout


def test_the_benchmarks_read_touches_every_byte_of_a_lazily_mapped_tensor(tmp_path):
    """safetensors maps tensors lazily: taking one reads nothing, so a 'read' that only takes tensors measures start-up
    (the suite's mask reads and merge floor did until 2026-12-06). touch must bring the mapped pages in (the file pages
    this process maps, RssFile, grow by the tensor's size); an empty tensor is no error."""
    import torch
    from safetensors.torch import save_file

    from benchmarks.read_tensors import touch
    from graft.tensors import TensorReader

    def mapped_mb() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no RssFile in /proc/self/status")

    path = tmp_path / "t.safetensors"
    save_file({"big": torch.ones(16_000_000), "empty": torch.zeros(0)}, str(path))   # 64 MB
    with TensorReader(path) as r:
        before = mapped_mb()
        big = r.get("big")
        taken = mapped_mb() - before
        assert touch(big) == 16_000_000 and touch(r.get("empty")) == 0
        touched = mapped_mb() - before
    assert taken < 32 and touched > 60, (taken, touched)


def test_a_childs_result_is_its_last_json_line_of_that_key_among_engine_logs():
    from benchmarks.common import json_line

    out = ('INFO engine started\n{"seconds": 1.0}\n{"ready": true}\n{"seconds": 2.5, "note": "x"}\n'
           'INFO engine shut down {"seconds": 9}\n')
    assert json_line(out, "seconds") == {"seconds": 2.5, "note": "x"}   # the last one, not a log line's braces
    assert json_line(out, "ready") == {"ready": True}
    assert json_line(out, "sweep") is None
