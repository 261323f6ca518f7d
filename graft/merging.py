"""Deltas, retention-Fisher masks and merges: the tensor math of grafting.

graft:      theta = theta_post + lam * M_rho(theta_donor_ft - theta_donor)
SFT+merge:  theta = theta_post + lam * (theta_sft - theta_post)       (identical to WiSE-FT with mixing weight lam)
Everything streams one tensor at a time (bounded memory at any model size); arithmetic is fp32 and merged weights
are cast back to the post model's dtype.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch

from graft.kfac import kfac_project_rotated, kfac_rotation, kfac_scores_rotated
from graft.scratch import Scratch
from graft.registry import FISHER_MASKS, MASK_KINDS
from graft.selection import ScoreStore, select_top_k, top_rho_count
from graft.tensors import (INDEX, CheckpointError, TensorReader, all_finite, check_compatible, copy_model_files,
                           read_json, write_like)

ZERO64 = torch.zeros((), dtype=torch.float64)
# elements per block of rows a merge computes at once (4 MB in fp32): the block's few fp32 temporaries stay in the
# CPU's caches; 16 MB blocks went through memory at every pass (1B bf16 merge here: 1.3-2.2 s against 4.9-10.8 s,
# the same bytes; smaller blocks pay Python per block: 131,072 elements took 4.7 s)
MERGE_BLOCK = 1 << 20


def tensor_delta(ft: torch.Tensor, base: torch.Tensor, name: str) -> torch.Tensor:
    if ft.shape != base.shape:
        raise CheckpointError(f"tensor {name}: shape {list(ft.shape)} vs {list(base.shape)}")
    d = ft.float() - base.float()
    if not all_finite(d):
        raise FloatingPointError(f"tensor {name}: delta has NaN or Inf")
    return d


def same_tensors(a: TensorReader, b: TensorReader, what: str) -> None:
    """Refuse two checkpoints (model, delta, Fisher) that do not hold the same tensor names."""
    if a.names() != b.names():
        diff = sorted(set(a.names()) ^ set(b.names()))
        raise CheckpointError(f"{what}: {a.path} and {b.path} hold different tensors, e.g. {diff[0]}")


def write_delta(ft_dir: str | Path, base_dir: str | Path, out_dir: str | Path) -> dict[str, float]:
    """Stream ft - base (fp32, keyed by parameter name) into ``out_dir``, sharded like ft. Returns squared norms."""
    check_compatible(ft_dir, base_dir)
    norms: dict[str, float] = {}
    with TensorReader(ft_dir) as ft, TensorReader(base_dir) as base:
        same_tensors(ft, base, "delta")
        for name in ft.names():
            if ft.shape(name) != base.shape(name):
                raise CheckpointError(f"tensor {name}: shape {ft.shape(name)} vs {base.shape(name)}")

        def produce(name: str) -> torch.Tensor:
            d = tensor_delta(ft.get(name), base.get(name), name)
            norms[name] = float(d.double().pow(2).sum())
            return d

        write_like(ft, out_dir, torch.float32, produce)
    return norms


def compute_delta(ft_dir: str | Path, base_dir: str | Path) -> dict[str, torch.Tensor]:
    """In-memory ft - base (small models and tests)."""
    check_compatible(ft_dir, base_dir)
    with TensorReader(ft_dir) as ft, TensorReader(base_dir) as base:
        same_tensors(ft, base, "delta")
        return {name: tensor_delta(ft.get(name), base.get(name), name) for name in ft.names()}


def diagonal_scores(fisher: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """s_j = F_j * delta_j^2 (how much coordinate j moves the old-task KL, paper Eq. 3-5)."""
    return {name: diagonal_score(fisher.get(name), d, name) for name, d in delta.items()}


def diagonal_score(f: torch.Tensor | None, d: torch.Tensor, name: str) -> torch.Tensor:
    if f is None:
        raise CheckpointError(f"tensor {name}: no Fisher entry")
    if f.shape != d.shape:
        raise CheckpointError(f"tensor {name}: Fisher shape {list(f.shape)} vs delta {list(d.shape)}")
    if not all_finite(f):
        raise FloatingPointError(f"tensor {name}: Fisher has NaN or Inf")
    d = d.float()
    return torch.mul(d, d).mul_(f.float())   # f * d^2, bitwise, with one temporary instead of two


def random_scores(name: str, shape: list[int], seed: int) -> torch.Tensor:
    """Seeded uniform scores: top-rho of these is a random mask of the same size (a control)."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") % (2**63 - 1)
    return torch.rand(shape, generator=torch.Generator().manual_seed(h))


class MaskPlan:
    """How to score and project each delta tensor for one mask kind.

    For ``kfac``, ``kfac`` is the fisher stage's KFAC file: per 2-D linear weight inside the blocks, the
    eigendecompositions of P (U, sigma) and Q (V, d), read one layer at a time; every other tensor is scored
    diagonally (a vocab x vocab factor is out of reach).
    """

    def __init__(self, kind: str, delta: TensorReader, fisher: TensorReader | None = None,
                 kfac: TensorReader | None = None, seed: int = 0):
        if kind not in MASK_KINDS:
            raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {kind!r}")
        if kind in FISHER_MASKS and fisher is None:
            raise ValueError(f"mask kind {kind} needs a diagonal Fisher")
        if kind == "kfac" and kfac is None:
            raise ValueError("mask kind kfac needs the KFAC factors")
        self.kind, self.delta, self.fisher, self.seed = kind, delta, fisher, seed
        self.kfac = kfac if kind == "kfac" else None
        self.kfac_names = set()
        if self.kfac is not None:
            self.kfac_names = {k[: -len(".P_eigvecs")] for k in self.kfac.names() if k.endswith(".P_eigvecs")}
        self._cached: tuple[str, tuple] | None = None
        self._fisher_cached: tuple[str, torch.Tensor] | None = None
        for name in sorted(self.kfac_names):
            if name not in delta:
                raise CheckpointError(f"KFAC factors for {name}, which the delta does not hold")
            shape = delta.shape(name)
            got = [self.kfac.shape(f"{name}.P_eigvecs")[0], self.kfac.shape(f"{name}.Q_eigvecs")[0]]
            if got != shape:
                raise CheckpointError(f"tensor {name}: KFAC factors {got[0]}x{got[1]} vs delta {shape}")
        if fisher is not None:
            missing = sorted(set(delta.names()) - set(fisher.names()))
            if missing:
                raise CheckpointError(f"tensor {missing[0]}: no Fisher entry")

    def eigen(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(U, sigma, V, d) of one layer; the last one read is kept, since scoring and projecting follow each other."""
        if self._cached is None or self._cached[0] != name:
            r = self.kfac
            self._cached = (name, (r.get(f"{name}.P_eigvecs"), r.get(f"{name}.P_eigvals"),
                                   r.get(f"{name}.Q_eigvecs"), r.get(f"{name}.Q_eigvals")))
        return self._cached[1]

    def fisher_tensor(self, name: str) -> torch.Tensor | None:
        """The diagonal Fisher of one tensor; the last one read is kept, since scoring and the mask's statistics
        follow each other."""
        if self.fisher is None:
            return None
        if self._fisher_cached is None or self._fisher_cached[0] != name:
            self._fisher_cached = (name, self.fisher.get(name))
        return self._fisher_cached[1]

    def rotation(self, name: str, d: torch.Tensor) -> torch.Tensor | None:
        """U^T dW V for a KFAC layer (what its scores and its projection are both computed from), else None."""
        if name not in self.kfac_names:
            return None
        U, _, V, _ = self.eigen(name)
        return kfac_rotation(d, U, V)

    def scores(self, name: str, d: torch.Tensor, rot: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor's scores; for a KFAC layer from ``rot`` (``rotation``'s result) when given."""
        if self.kind == "random":
            return random_scores(name, list(d.shape), self.seed)
        if name in self.kfac_names:
            _, sigma, _, dq = self.eigen(name)
            return kfac_scores_rotated(self.rotation(name, d) if rot is None else rot, sigma, dq)
        return diagonal_score(self.fisher_tensor(name), d, name)

    def project(self, name: str, d: torch.Tensor, drop: torch.Tensor, rot: torch.Tensor | None = None
                ) -> torch.Tensor:
        if name in self.kfac_names:
            U, _, V, _ = self.eigen(name)
            return kfac_project_rotated(d, self.rotation(name, d) if rot is None else rot, U, V, drop)
        return d.float().masked_fill(drop, 0.0)


def write_masked_delta(plan: MaskPlan, rho: float, out_dir: str | Path, score_memory_share: float = 0.25
                       ) -> dict[str, float]:
    """Stream M_rho(delta) into ``out_dir`` (sharded like the delta): exactly floor(rho * N) directions (entries or
    KFAC eigen-directions) with the highest scores are removed; ties go to the earliest position in the delta's
    streaming order (``TensorReader.ordered_names``, row-major). Returns counts, the share of the kind's own score
    removed (for ``random`` that is a share of random keys, not a sensitivity), and, when the plan has a diagonal
    Fisher, the update's Fisher-weighted size in one (diagonal) metric for every kind, as fractions of sum F delta^2:
    ``fisher_share_removed`` = sum F (delta - M(delta))^2 and ``fisher_share_kept`` = sum F M(delta)^2. They add up to
    1 for entry masks (diagonal, random); a KFAC projection is not orthogonal in this metric, so there they need not
    (the kept share is what the diagonal approximation says the old task feels). The scores are kept in memory when
    they take under ``score_memory_share`` of the memory available, else in a spill file inside ``out_dir`` that is
    removed before returning: the bytes written are the same either way."""
    names = plan.delta.ordered_names()
    total = sum(_numel(plan.delta.shape(n)) for n in names)
    k = top_rho_count(total, rho) if plan.kind != "none" else 0
    if plan.kind != "none" and rho > 0 and k == 0:   # the "masked" graft would silently be the unmasked one
        raise ValueError(f"rho {rho} masks floor(rho x {total}) = 0 of the delta's {total} directions: the {plan.kind} "
                         f"mask would remove nothing; use a larger value in sweep.rhos")
    # Each tensor is scored once (the delta and the Fisher or KFAC eigenbasis read once for it) and its scores kept;
    # the selection's passes read them back, and the writer reads the delta again only to mask it.
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    store = ScoreStore(total, out_dir / ".scores.spill", score_memory_share)
    # a KFAC layer's rotation U^T dW V is kept from scoring for its projection: 4 matrix products per layer, not 6
    kfac_total = sum(_numel(plan.delta.shape(n)) for n in names if n in plan.kfac_names) if plan.kind == "kfac" else 0
    rotations = ScoreStore(kfac_total, out_dir / ".rotations.spill", score_memory_share)
    scored = False

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal scored
        for name in names:
            if not scored:
                d = plan.delta.get(name).float()
                rot = plan.rotation(name, d)   # None but for a KFAC layer of a kfac plan
                store.put(name, plan.scores(name, d, rot))
                if rot is not None:
                    rotations.keep(name, rot)
                del d, rot
            yield name, store.get(name)
        scored = True

    if k == 0:  # nothing to select: skip scoring entirely (kind none needs no Fisher)
        selection = iter([(n, torch.zeros(plan.delta.shape(n), dtype=torch.bool)) for n in names])
    else:
        selection = select_top_k(stream, k, checked=True)
    stats = {"entries": total, "masked": 0, "score_total": 0.0, "score_masked": 0.0}
    fisher_total = fisher_removed = fisher_kept = 0.0
    # fp64 temporaries of the statistics live in reused buffers (graft.scratch says why); every sum is over a whole
    # tensor's values in row-major order, as before, so each statistic is bitwise what fresh tensors gave
    scratch = Scratch()

    def as_f64(name: str, t: torch.Tensor) -> torch.Tensor:
        return scratch.take(name, t.shape, torch.float64).copy_(t)

    def produce(name: str) -> torch.Tensor:
        nonlocal fisher_total, fisher_removed, fisher_kept
        sel_name, drop = next(selection)
        assert sel_name == name
        d = plan.delta.get(name).float()
        if k > 0:
            s = store.get(name)
            stats["score_total"] += float(as_f64("a", s).sum())
            stats["score_masked"] += float(s[drop].double().sum())
            del s
        stats["masked"] += int(torch.count_nonzero(drop))
        rot = rotations.get(name) if name in plan.kfac_names and k > 0 else None
        kept = plan.project(name, d, drop, rot)
        del rot
        if plan.fisher is not None:
            # f stays fp32: an fp32 operand of an fp64 product is widened exactly, as f.double() did
            f, d64 = plan.fisher_tensor(name), as_f64("a", d)
            if name in plan.kfac_names:   # a projection: the kept update is not the delta with entries zeroed
                # each value as f64 * x ** 2 gives it, computed in place
                kept64 = as_f64("b", kept)
                fisher_total += float(torch.mul(d64, d64, out=scratch.take("c", d.shape, torch.float64))
                                      .mul_(f).sum())
                removed = d64.sub_(kept64)
                fisher_removed += float(removed.mul_(removed).mul_(f).sum())
                fisher_kept += float(kept64.mul_(kept64).mul_(f).sum())
            else:   # entries zeroed: the same terms, elementwise, in place (each value as f64 * d64 ** 2 gives it)
                fd2 = d64.mul_(d64).mul_(f)
                fisher_total += float(fd2.sum())
                fisher_removed += float(torch.where(drop, fd2, ZERO64, out=scratch.take("b", d.shape, torch.float64))
                                        .sum())
                fisher_kept += float(fd2.masked_fill_(drop, 0.0).sum())
        return kept

    with store, rotations:
        write_like(plan.delta, out_dir, torch.float32, produce)
    scratch.clear()
    stats["score_share_masked"] = stats["score_masked"] / stats["score_total"] if stats["score_total"] else 0.0
    if plan.fisher is not None:
        stats["fisher_share_removed"] = fisher_removed / fisher_total if fisher_total else 0.0
        stats["fisher_share_kept"] = fisher_kept / fisher_total if fisher_total else 0.0
    return stats


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def exact_top_rho_keep(scores: Mapping[str, torch.Tensor], rho: float) -> dict[str, torch.Tensor]:
    """Keep-masks (True = keep) zeroing exactly floor(rho * N) highest scores; ties to the earliest position."""
    names = sorted(scores)
    k = top_rho_count(sum(scores[n].numel() for n in names), rho)
    return {n: ~sel for n, sel in select_top_k(lambda: ((n, scores[n]) for n in names), k)}


def merge_tensor(post: torch.Tensor, delta: torch.Tensor, keep: torch.Tensor | None, lam: float) -> torch.Tensor:
    """post + lam * (keep * delta) computed in fp32, returned in post's dtype."""
    d = delta.float()
    if keep is not None:
        d = d * keep.to(torch.float32)
    scaled = lam * d   # a new tensor: the sum goes into it in place
    if post.dtype in (torch.float32, torch.bfloat16, torch.float16):
        # post's values are exact in fp32, so the in-place fp32 add is bitwise post.float() + lam * d
        return scaled.add_(post).to(post.dtype)
    return (post.float() + scaled).to(post.dtype)


def check_merged_finite(name: str, merged: torch.Tensor) -> torch.Tensor:
    """A merged tensor in its own dtype must be finite (fp16 overflows at 65504 where the fp32 arithmetic did not)."""
    if not all_finite(merged):
        raise FloatingPointError(f"tensor {name}: the merged weights overflow {merged.dtype} (NaN or Inf); merge "
                                 "into a wider dtype or lower lambda")
    return merged


def merge_into_dir(post_dir: str | Path, delta_path: str | Path, lam: float, out_dir: str | Path,
                   combine: Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
    """Write post + lam * delta as a model directory sharded like the post model, one tensor in memory at a time.

    ``combine(name, post, delta)`` replaces the default per-tensor rule (used by Fisher merging)."""
    out_dir = Path(out_dir)
    copy_model_files(post_dir, out_dir)
    with TensorReader(post_dir) as post, TensorReader(delta_path) as delta:
        same_tensors(post, delta, "merge")
        for name in post.names():
            if post.shape(name) != delta.shape(name):
                raise CheckpointError(f"tensor {name}: post shape {post.shape(name)} vs delta {delta.shape(name)}")
        rule = combine or (lambda name, w, d: merge_tensor(w, d, None, lam))

        def merged(name: str, w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            if combine is not None and not all_finite(d):
                raise FloatingPointError(f"tensor {name}: {delta_path} has NaN or Inf")
            out = rule(name, w, d)
            # post + lam * d is finite only if d is: one check of the result, and the delta's only to say which
            if not all_finite(out):
                if not all_finite(d):
                    raise FloatingPointError(f"tensor {name}: {delta_path} has NaN or Inf")
                check_merged_finite(name, out)   # raises: the overflow of the output dtype, named
            return out

        def produce(name: str):
            shape = post.shape(name)
            if combine is not None or len(shape) < 2:
                return merged(name, post.get(name), delta.get(name))
            # the default rule is elementwise: blocks of rows give the same bytes with a block in memory, not a
            # tensor (the embedding of a large vocabulary is the largest tensor by far)
            step = max(1, MERGE_BLOCK // max(1, math.prod(shape[1:])))
            return (merged(name, post.rows(name, i, i + step), delta.rows(name, i, i + step))
                    for i in range(0, shape[0], step))

        write_like(post, out_dir, None, produce)
        if (Path(post_dir) / INDEX).exists():  # keep the post model's own index metadata (e.g. total_size)
            index = read_json(Path(post_dir) / INDEX)
            (out_dir / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))


def fisher_merge_tensor(post: torch.Tensor, ft: torch.Tensor, f_post: torch.Tensor, f_ft: torch.Tensor, lam: float,
                        floor: float) -> torch.Tensor:
    """Fisher merging (Matena & Raffel 2022) of two models with weights (1 - lam, lam), Fishers floored at ``floor``:
    theta = ((1-lam) F_post theta_post + lam F_ft theta_ft) / ((1-lam) F_post + lam F_ft)."""
    a = (1.0 - lam) * f_post.float().clamp(min=floor)
    b = lam * f_ft.float().clamp(min=floor)
    return ((a * post.float() + b * ft.float()) / (a + b)).to(post.dtype)


def fisher_share_top(fisher: Mapping[str, torch.Tensor] | TensorReader, delta: TensorReader, top: float = 0.01
                     ) -> float:
    """Share of sum_j F_j delta_j^2 that falls in the top ``top`` fraction of coordinates ranked by F (paper Fig. 8)."""
    get = fisher.get
    names = delta.ordered_names()
    total = sum(_numel(delta.shape(n)) for n in names)
    k = max(1, top_rho_count(total, top))
    sel = dict(select_top_k(lambda: ((n, get(n)) for n in names), k))
    num = den = 0.0
    for n in names:
        s = get(n).float() * delta.get(n).float().pow(2)
        den += float(s.double().sum())
        num += float(s.double()[sel[n]].sum())
    return num / den if den else 0.0
