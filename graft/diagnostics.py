"""Weight-space diagnostics of the world and of the updates (is post-training a small perturbation? do the graft and
SFT deltas point the same way?). Streamed tensor by tensor in fp64 accumulators: bounded memory at any model size."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from graft.merging import same_tensors
from graft.tensors import CheckpointError, TensorReader


def relative_change(new_dir: str | Path, old_dir: str | Path) -> tuple[float, list[dict]]:
    """||new - old|| / ||old|| over all tensors, and per tensor (name, numel, relative change)."""
    total_d = total_o = 0.0
    rows = []
    with TensorReader(new_dir) as new, TensorReader(old_dir) as old:
        same_tensors(new, old, "relative change")
        for name in new.names():
            a, b = new.get(name).double(), old.get(name).double()
            if a.shape != b.shape:
                raise CheckpointError(f"tensor {name}: shape {list(a.shape)} vs {list(b.shape)}")
            d2, o2 = float((a - b).pow(2).sum()), float(b.pow(2).sum())
            total_d, total_o = total_d + d2, total_o + o2
            rows.append({"tensor": name, "numel": a.numel(),
                         "relative_change": math.sqrt(d2 / o2) if o2 > 0 else float("nan")})
    return math.sqrt(total_d / total_o), rows


def delta_geometry(a_dir: str | Path, b_dir: str | Path) -> dict[str, float]:
    """Norms of two deltas over the same tensors and the cosine between them (flattened over the whole model)."""
    aa = bb = ab = 0.0
    with TensorReader(a_dir) as a, TensorReader(b_dir) as b:
        same_tensors(a, b, "delta geometry")
        for name in a.names():
            x, y = a.get(name).double().flatten(), b.get(name).double().flatten()
            if x.shape != y.shape:
                raise CheckpointError(f"tensor {name}: shape {list(x.shape)} vs {list(y.shape)}")
            aa, bb, ab = aa + float(x @ x), bb + float(y @ y), ab + float(x @ y)
    cos = ab / math.sqrt(aa * bb) if aa > 0 and bb > 0 else float("nan")
    return {"norm_a": math.sqrt(aa), "norm_b": math.sqrt(bb), "cosine": cos}


def model_norm(model_dir: str | Path) -> float:
    with TensorReader(model_dir) as m:
        return math.sqrt(sum(float(m.get(n).double().pow(2).sum()) for n in m.names()))
