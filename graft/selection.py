"""Exact global top-k selection over scores that are streamed tensor by tensor.

Scores are non-negative fp32. Their IEEE-754 bit patterns, read as int32, are ordered like the values (the sign bit
is 0), so the k-th largest score is found by radix selection in two passes: a histogram of the high 16 bits of
every pattern, then, among the scores in the bin that holds the k-th largest, a histogram of the low 15 bits. A third
pass marks the selection. Ties at the threshold are broken by position: tensors in the order the caller streams
them, elements in row-major order, earlier first. The selected count is exactly k.

``ScoreStore`` keeps scores computed once (in memory, or in a spill file when they would not fit comfortably), so
that the passes read them back instead of recomputing them from the delta and the Fisher; a second one keeps the KFAC
rotations the scores came from, so that the projection does not compute them again.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from graft.scratch import Scratch

ScoreStream = Callable[[], Iterable[tuple[str, torch.Tensor]]]
LOW_BITS = 15   # a non-negative fp32 pattern is 31 bits: 16 high (pass 1) + 15 low (pass 2)


def _bits(scores: torch.Tensor, name: str, checked: bool = False, owned: bool = False) -> torch.Tensor:
    """The scores' fp32 bit patterns as int32 (order-preserving), after checking they are finite and >= 0 (unless
    ``checked``: scores already checked, with -0.0 already made +0.0, as ``ScoreStore`` keeps them). ``owned``: fp32
    scores nobody else holds, made +0.0 in place instead of in a copy."""
    s = scores.reshape(-1).to(torch.float32)
    if checked:
        return s.view(torch.int32)
    if s.numel():
        lo, hi = torch.aminmax(s)   # one pass: NaN propagates into both, Inf and negatives show in one
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            raise FloatingPointError(f"tensor {name}: scores contain NaN or Inf")
        if lo < 0:
            raise ValueError(f"tensor {name}: scores must be non-negative")
    # -0.0 -> +0.0, so equal values have equal bit patterns
    s = s.add_(0.0) if owned else s + 0.0
    return s.view(torch.int32)


def _walk_down(hist: torch.Tensor, remaining: int) -> tuple[int, int]:
    """(bin holding the ``remaining``-th largest, count in the bins above it), walking from the largest bin down."""
    above_incl = torch.flip(hist, [0]).cumsum(0)   # above_incl[i]: count in bins >= len - 1 - i
    i = int(torch.searchsorted(above_incl, torch.tensor([remaining], dtype=above_incl.dtype)).item())
    b = hist.numel() - 1 - i
    return b, int(above_incl[i] - hist[b])


def kth_largest_bits(stream: ScoreStream, k: int, checked: bool = False) -> tuple[int, int, int]:
    """(bit pattern of the k-th largest score, how many scores are strictly greater, total count); k >= 1."""
    hist = torch.zeros(1 << (31 - LOW_BITS), dtype=torch.int64)
    total = 0
    scratch = Scratch()
    for name, scores in stream():
        b = _bits(scores, name, checked)
        total += b.numel()
        top = torch.bitwise_right_shift(b, LOW_BITS, out=scratch.take("high bits", b.shape, torch.int32))
        hist += torch.bincount(top, minlength=hist.numel())
    scratch.clear()
    if not 1 <= k <= total:
        raise ValueError(f"k={k} out of range for {total} scores")
    high, greater = _walk_down(hist, k)
    low_hist = torch.zeros(1 << LOW_BITS, dtype=torch.int64)
    lo, hi = high << LOW_BITS, (high + 1) << LOW_BITS
    for name, scores in stream():
        b = _bits(scores, name, checked)
        # one comparison over every score leaves the few at or above the bin; then those inside it
        above = b[b >= lo]
        low_hist += torch.bincount(above[above < hi] & ((1 << LOW_BITS) - 1), minlength=low_hist.numel())
    low, above = _walk_down(low_hist, k - greater)
    return (high << LOW_BITS) | low, greater + above, total


def select_top_k(stream: ScoreStream, k: int, checked: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, selected) boolean masks, True for the exactly k largest scores (ties: earliest position).
    ``checked``: every score is known finite, non-negative and never -0.0 (``ScoreStore`` makes them so)."""
    if k <= 0:
        for name, scores in stream():
            yield name, torch.zeros(scores.shape, dtype=torch.bool)
        return
    thr, greater, _ = kth_largest_bits(stream, k, checked)
    need = k - greater  # how many scores equal to the threshold to take, in stream order
    for name, scores in stream():
        b = _bits(scores, name, checked).reshape(scores.shape)
        sel = b > thr
        if need > 0:
            tied = torch.nonzero((b == thr).reshape(-1)).reshape(-1)[:need]
            flat = sel.reshape(-1)
            flat[tied] = True
            need -= tied.numel()
        yield name, sel


def top_rho_count(total: int, rho: float) -> int:
    """Number of coordinates masked: floor(rho * total)."""
    if not 0 <= rho < 1:
        raise ValueError(f"rho must be in [0, 1), got {rho}")
    return math.floor(rho * total)


def available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes (a large number where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


class ScoreStore:
    """fp32 scores of named tensors, put once in streaming order and read back by name. Held in memory when they
    take under ``memory_share`` of the memory available now, else appended to ``spill`` (a file removed on close).
    Where they live changes speed and memory only, never a value."""

    def __init__(self, total_entries: int, spill: str | Path, memory_share: float = 0.25):
        self.in_memory = total_entries * 4 <= memory_share * available_memory()
        self.spill = Path(spill)
        self._mem: dict[str, torch.Tensor] = {}
        self._where: dict[str, tuple[int, list[int]]] = {}
        self._file = None if self.in_memory else open(self.spill, "w+b")

    def put(self, name: str, scores: torch.Tensor) -> None:
        """Check the scores once (finite, >= 0; -0.0 made +0.0) and keep them. The store takes ``scores`` over: fp32
        scores are normalised in place, and the caller must not use them afterwards."""
        self.keep(name, _bits(scores, name, owned=True).view(torch.float32).reshape(scores.shape))

    def keep(self, name: str, values: torch.Tensor) -> None:
        """Keep fp32 ``values`` as they are, unchecked (what scores are computed from, e.g. a KFAC rotation)."""
        s = values.to(torch.float32).contiguous()
        if self.in_memory:
            self._mem[name] = s
            return
        self._where[name] = (self._file.tell(), list(s.shape))
        self._file.write(memoryview(s.reshape(-1).numpy()))

    def get(self, name: str) -> torch.Tensor:
        if self.in_memory:
            return self._mem[name]
        offset, shape = self._where[name]
        n = math.prod(shape)
        self._file.flush()
        self._file.seek(offset)
        buf = bytearray(n * 4)
        self._file.readinto(buf)
        self._file.seek(0, os.SEEK_END)
        return torch.frombuffer(buf, dtype=torch.float32).reshape(shape)

    def close(self) -> None:
        self._mem.clear()
        if self._file is not None:
            self._file.close()
            self._file = None
            self.spill.unlink(missing_ok=True)

    def __enter__(self) -> "ScoreStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
