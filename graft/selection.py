"""Exact global top-k selection over scores that are streamed tensor by tensor, never all in memory.

Scores are non-negative fp32. Their IEEE-754 bit patterns, read as int32, are ordered like the values, so the k-th
largest score is found by radix selection: four passes, each histogramming one byte of the bit pattern among the
scores that share the bytes fixed so far. A final pass marks the selection. Ties at the threshold are broken by
position: tensors in the order the caller streams them, elements in row-major order, earlier first.
The selected count is exactly k.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator

import torch

ScoreStream = Callable[[], Iterable[tuple[str, torch.Tensor]]]


def _bits(scores: torch.Tensor, name: str) -> torch.Tensor:
    s = scores.reshape(-1).to(torch.float32)
    if not torch.isfinite(s).all():
        raise FloatingPointError(f"tensor {name}: scores contain NaN or Inf")
    if (s < 0).any():
        raise ValueError(f"tensor {name}: scores must be non-negative")
    s = s + 0.0  # -0.0 -> +0.0, so equal values have equal bit patterns
    return s.view(torch.int32).to(torch.int64)


def kth_largest_bits(stream: ScoreStream, k: int) -> tuple[int, int, int]:
    """(bit pattern of the k-th largest score, how many scores are strictly greater, total count); k >= 1."""
    prefix, prefix_mask = 0, 0
    remaining = k  # rank of the target among scores matching the prefix so far, counted from the top
    greater = 0
    total = 0
    for shift in (24, 16, 8, 0):
        hist = torch.zeros(256, dtype=torch.int64)
        count = 0
        for name, scores in stream():
            b = _bits(scores, name)
            count += b.numel()
            sel = b[(b & prefix_mask) == prefix] if prefix_mask else b
            hist += torch.bincount((sel >> shift) & 0xFF, minlength=256)
        total = count
        if shift == 24 and not 1 <= k <= total:
            raise ValueError(f"k={k} out of range for {total} scores")
        above = 0
        for byte in range(255, -1, -1):  # walk bins from the largest values down
            if above + int(hist[byte]) >= remaining:
                remaining -= above
                greater += above
                prefix |= byte << shift
                prefix_mask |= 0xFF << shift
                break
            above += int(hist[byte])
    return prefix, greater, total


def select_top_k(stream: ScoreStream, k: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, selected) boolean masks, True for the exactly k largest scores (ties: earliest position)."""
    if k <= 0:
        for name, scores in stream():
            yield name, torch.zeros(scores.shape, dtype=torch.bool)
        return
    thr, greater, _ = kth_largest_bits(stream, k)
    need = k - greater  # how many scores equal to the threshold to take, in stream order
    for name, scores in stream():
        b = _bits(scores, name).reshape(scores.shape)
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
