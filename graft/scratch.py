"""Reusable working memory for passes that stream tensor after tensor.

torch's CPU allocator hands large tensors straight to the kernel and back, so every fresh temporary of a streamed
tensor is paid again in page faults (first touch zeroes every page): measured on a 135M-entry mask, about 620,000
minor faults per stage, several times the bytes the stage reads. A ``Scratch`` keeps one growing buffer per purpose and
lends views of it, so a temporary costs its arithmetic only. Where an intermediate lives never changes a value.
"""
from __future__ import annotations

import torch


class Scratch:
    """Named buffers, each grown to the largest request made of it; ``take`` returns a view, valid until the next
    ``take`` of the same name."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, name: str, shape: torch.Size | list[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape`` and ``dtype``, backed by the buffer ``name``."""
        n = 1
        for s in shape:
            n *= s
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = self._buffers[(name, dtype)] = torch.empty(n, dtype=dtype)
        return buf[:n].view(shape)

    def clear(self) -> None:
        self._buffers.clear()
