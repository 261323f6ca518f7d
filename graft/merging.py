"""Deltas, retention-Fisher masks and merges: the tensor math of grafting.

graft:      theta = theta_post + lam * M_rho(theta_donor_ft - theta_donor)
SFT+merge:  theta = theta_post + lam * (theta_sft - theta_post)
All arithmetic in fp32; the merged weights are cast back to the post model's dtype.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping

import torch

from graft.tensors import INDEX, CheckpointError, TensorReader, check_compatible, copy_model_files, save_tensors


def tensor_delta(ft: torch.Tensor, base: torch.Tensor, name: str) -> torch.Tensor:
    if ft.shape != base.shape:
        raise CheckpointError(f"tensor {name}: shape {list(ft.shape)} vs {list(base.shape)}")
    d = ft.float() - base.float()
    if not torch.isfinite(d).all():
        raise FloatingPointError(f"tensor {name}: delta has NaN or Inf")
    return d


def compute_delta(ft_dir: str | Path, base_dir: str | Path) -> dict[str, torch.Tensor]:
    """ft - base, fp32, keyed by parameter name; both checkpoints must hold exactly the same tensors."""
    check_compatible(ft_dir, base_dir)
    with TensorReader(ft_dir) as ft, TensorReader(base_dir) as base:
        if ft.names() != base.names():
            extra = sorted(set(ft.names()) ^ set(base.names()))
            raise CheckpointError(f"{ft_dir} and {base_dir} hold different tensors, e.g. {extra[0]}")
        return {name: tensor_delta(ft.get(name), base.get(name), name) for name in ft.names()}


def diagonal_scores(fisher: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """s_j = F_j * delta_j^2 (how much coordinate j moves the old-task KL, paper Eq. 3-5)."""
    out = {}
    for name, d in delta.items():
        if name not in fisher:
            raise CheckpointError(f"tensor {name}: no Fisher entry")
        if fisher[name].shape != d.shape:
            raise CheckpointError(f"tensor {name}: Fisher shape {list(fisher[name].shape)} vs delta {list(d.shape)}")
        out[name] = fisher[name].float() * d.float().pow(2)
    return out


def top_rho_count(total: int, rho: float) -> int:
    """Number of coordinates masked: floor(rho * total)."""
    if not 0 <= rho < 1:
        raise ValueError(f"rho must be in [0, 1), got {rho}")
    return math.floor(rho * total)


def exact_top_rho_keep(scores: Mapping[str, torch.Tensor], rho: float) -> dict[str, torch.Tensor]:
    """Keep-masks (True = keep) that zero exactly floor(rho * N) coordinates with the highest scores.

    Ties at the threshold are broken by position: tensors in sorted-name order, elements in row-major order,
    earlier positions masked first. The count is exact whatever the ties.
    """
    names = sorted(scores)
    flat = torch.cat([scores[n].reshape(-1).float() for n in names]) if names else torch.zeros(0)
    if not torch.isfinite(flat).all():
        raise FloatingPointError("mask scores contain NaN or Inf")
    k = top_rho_count(flat.numel(), rho)
    drop = torch.zeros(flat.numel(), dtype=torch.bool)
    if k > 0:
        # the k-th largest value is the (N - k + 1)-th smallest
        thr = torch.kthvalue(flat, flat.numel() - k + 1).values
        above = flat > thr
        drop |= above
        need = k - int(above.sum())
        tied = torch.nonzero(flat == thr).reshape(-1)[:need]
        drop[tied] = True
    keep, offset = {}, 0
    for n in names:
        size = scores[n].numel()
        keep[n] = ~drop[offset: offset + size].reshape(scores[n].shape)
        offset += size
    return keep


def merge_tensor(post: torch.Tensor, delta: torch.Tensor, keep: torch.Tensor | None, lam: float) -> torch.Tensor:
    """post + lam * (keep * delta) computed in fp32, returned in post's dtype."""
    d = delta.float()
    if keep is not None:
        d = d * keep.to(torch.float32)
    return (post.float() + lam * d).to(post.dtype)


def merge_into_dir(post_dir: str | Path, delta_path: str | Path, keep_path: str | Path | None, lam: float,
                   out_dir: str | Path) -> None:
    """Write post + lam * M(delta) as a model directory sharded like the post model (one shard in memory)."""
    out_dir = Path(out_dir)
    copy_model_files(post_dir, out_dir)
    with TensorReader(post_dir) as post, TensorReader(delta_path) as delta:
        keep = TensorReader(keep_path) if keep_path is not None else None
        try:
            missing = sorted(set(post.names()) ^ set(delta.names()))
            if missing:
                raise CheckpointError(f"delta {delta_path} and post {post_dir} disagree on tensor {missing[0]}")
            shards = post.shards()
            for shard, names in shards.items():
                out = {}
                for name in names:
                    w, d = post.get(name), delta.get(name)
                    if list(w.shape) != list(d.shape):
                        raise CheckpointError(f"tensor {name}: post shape {list(w.shape)} vs delta {list(d.shape)}")
                    out[name] = merge_tensor(w, d, keep.get(name) if keep is not None else None, lam)
                save_tensors(out_dir / shard, out)
            if (Path(post_dir) / INDEX).exists():
                index = json.loads((Path(post_dir) / INDEX).read_text())
                (out_dir / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
        finally:
            if keep is not None:
                keep.close()
