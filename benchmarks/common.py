"""What every benchmark row shares: wall-clock timing, peak private memory, the machine and its load, and the row
format of benchmarks/results.json (two times measured in the same run, their ratio and the goal)."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def json_line(text: str, key: str) -> dict | None:
    """The last line of a child's output that is a JSON object opening with ``key``: a benchmark child prints its
    result that way, and vLLM logs to stdout too, before and after it."""
    for line in reversed(text.splitlines()):
        if line.startswith(f'{{"{key}"'):
            return json.loads(line)
    return None


def rss_anon_mb(pid: int | str = "self") -> float:
    """Private (anonymous) resident memory of a process in MB; RSS would also count file pages that safetensors maps
    lazily, which are not memory a merge holds."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PrivatePeak:
    """Peak private memory above the starting level while a block runs, sampled every 5 ms, of this process or of
    another one (``pid``: a child such as the mergekit command)."""

    def __init__(self, pid: int | str = "self") -> None:
        self.pid, self.peak = pid, 0.0

    def __enter__(self) -> "PrivatePeak":
        self.base = rss_anon_mb(self.pid) if self.pid == "self" else 0.0
        self.peak, self.stop = 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_anon_mb(self.pid) - self.base)
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


class LoadSampler:
    """The 1-minute load average sampled every few seconds for the whole run (mean and max go in results.json)."""

    def __init__(self, every: float = 5.0) -> None:
        self.every, self.samples = every, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self.stop.wait(self.every)

    def __enter__(self) -> "LoadSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"mean_1min": round(sum(s) / len(s), 2), "max_1min": round(max(s), 2), "samples": len(s)}


def machine() -> dict:
    """Cores, CPU model and the SIMD flags that decide torch's kernels (results are reproducible per CPU kind)."""
    model, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                have = set(line.split(":", 1)[1].split())
                flags = sorted(f for f in have if f.startswith(("avx", "fma", "amx", "sse4")))
    except OSError:
        pass
    import torch

    return {"cores": os.cpu_count(), "cpu": model, "flags": flags, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "memory_gb": round(os.sysconf("SC_PAGE_SIZE")
                                                                          * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


@dataclass
class Row:
    """One comparison: ``measured`` against ``reference`` (seconds unless ``unit`` says otherwise), both from this
    run. ``goal`` is a bound on measured / reference (``<=``) or on reference / measured (``>=``, a speed-up)."""
    what: str
    size: str
    compared_with: str
    measured: float | None
    reference: float | None
    goal: str
    unit: str = "s"
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.measured is None or self.reference is None or not self.reference:
            return None
        if self.goal.startswith(">="):   # a speed-up: how many times faster measured is than the reference
            return self.reference / self.measured
        return self.measured / self.reference

    @property
    def met(self) -> bool | None:
        if self.ratio is None or not self.goal:
            return None
        op, bound = self.goal.split()[0], float(self.goal.split()[1].rstrip("x"))
        return self.ratio <= bound if op == "<=" else self.ratio >= bound

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(ratio=None if self.ratio is None else round(self.ratio, 4), met=self.met)
        for k in ("measured", "reference"):
            if out[k] is not None and self.unit == "s":
                out[k] = round(out[k], 4)
        return out


def markdown(rows: list[dict]) -> str:
    lines = ["| what | size | measured | compared with | reference | ratio | goal | met | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def num(v):
            return "" if v is None else f"{v:.3g} {r['unit']}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        met = {True: "yes", False: "**no**", None: ""}[r["met"]]
        lines.append(f"| {r['what']} | {r['size']} | {num(r['measured'])} | {r['compared_with']} | "
                     f"{num(r['reference'])} | {ratio} | {r['goal']} | {met} | {r['note']} |")
    return "\n".join(lines)
