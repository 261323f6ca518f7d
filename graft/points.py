"""Sweep points as weights: every point is a model directory, optionally plus ``lam`` times a delta directory.

graft (masked or not):  models.post + lam * tensors/{delta,masked}/...
graft from a candidate donor (the donor sweep): models.post + lam * tensors/delta/candidate_<name>/...
SFT + merge:            models.post + lam * tensors/delta/sft_...
post, SFT, OPSD, Fisher merging: a model directory as it is.
diagnostics:            models.base + t * tensors/delta/post_vs_base (the post-training path)

The evaluation stage loads the post model into one engine and writes each point's weights into it
(``point_tensors``), so a sweep never writes a merged model per point. ``stages.merge --point`` writes the same
tensors as a model directory when a user wants one: both go through ``merging.merge_tensor``, so they are bitwise
equal.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch

from graft.hashing import content_hash
from graft.merging import check_merged_finite, merge_tensor, same_tensors
from graft.registry import DIAGNOSTIC, DONOR_METHOD, GRAFT, PROPOSED_PREFIX, SFT_MERGE, masked_method
from graft.sweep import run_tag
from graft.tensors import CheckpointError, TensorReader, all_finite


POST_DELTA = "tensors/delta/post_vs_base"   # post - base, written by the delta_post stage


@dataclass(frozen=True)
class Point:
    name: str
    method: str                  # post | sft | sft_merge | fisher_merge | opsd | graft | graft_<kind> | graft_donor |
    #                              base_to_post
    model: str                   # model directory (loaded as it is)
    delta: str | None = None     # fp32 delta directory added with coefficient lam
    lam: float | None = None
    rho: float | None = None
    mask: str | None = None      # none | diagonal | kfac | random (graft points only)
    lr: float | None = None
    epoch: int | None = None
    alpha: float | None = None   # OPSD divergence
    donor: str | None = None     # the checkpoint the graft delta was learned on

    def as_dict(self) -> dict:
        return asdict(self)


def sweep_points(p: Mapping) -> list[Point]:
    """Every point the current params declare, in report order (names as dvc.yaml spells them)."""
    sweep, ft, opsd, post = p["sweep"], p["finetune"], p["opsd"], p["models"].post
    runs = [(lr, ep, run_tag(lr, ep)) for lr in ft.lrs for ep in sweep.epochs]
    pts = [Point("post", "post", post)]
    pts += [Point(f"sft_{r}", "sft", f"models/finetuned/sft_lr{lr}/epoch{ep}", lr=lr, epoch=ep)
            for lr, ep, r in runs]
    pts += [Point(f"sft_merge_lam{lam}_{r}", SFT_MERGE, post, f"tensors/delta/sft_{r}", lam, lr=lr, epoch=ep)
            for lam in sweep.lams for lr, ep, r in runs]
    pts += [Point(f"fisher_merge_lam{lam}_{r}", "fisher_merge", f"models/merged/fisher_merge_lam{lam}_{r}", lam=lam,
                  lr=lr, epoch=ep) for lam in sweep.fisher_merge_lams for lr, ep, r in runs]
    pts += [Point(f"graft_lam{lam}_{r}", GRAFT, post, f"tensors/delta/graft_{r}", lam, mask="none", lr=lr,
                  epoch=ep, donor=ft.donor) for lam in sweep.lams for lr, ep, r in runs]
    pts += [Point(f"graft_{kind}_lam{lam}_rho{rho}_{r}", masked_method(kind), post,
                  f"tensors/masked/{kind}_rho{rho}_{r}", lam, rho, kind, lr, ep, donor=ft.donor)
            for kind in sweep.masks for lam in sweep.lams for rho in sweep.rhos for lr, ep, r in runs]
    pts += donor_points(p)
    pts += [Point(f"opsd_alpha{a}_{r}", "opsd", f"models/opsd/alpha{a}_lr{lr}/epoch{ep}", lr=lr, epoch=ep, alpha=a)
            for a in opsd.alphas for lr, ep, r in runs]
    # diagnostics, not methods: the post-training path base + t * (post - base) (lam holds t)
    pts += [Point(f"base_to_post_t{t}", DIAGNOSTIC, p["models"].base, POST_DELTA, t)
            for t in p["diagnostics"].interpolation]
    return pts




def candidate_delta(name: str, lr: float, epoch: int) -> str:
    """Where stages.delta --kind candidate writes a candidate's delta at one snapshot."""
    return f"tensors/delta/candidate_{name}/{run_tag(lr, epoch)}"


def donor_points(p: Mapping) -> list[Point]:
    """Unmasked grafts from every candidate donor at every lambda and swept epoch, at donors.lr."""
    donors = p["donors"]
    return [Point(f"{DONOR_METHOD}-{name}_lam{lam}_{run_tag(donors.lr, ep)}", DONOR_METHOD, p["models"].post,
                  candidate_delta(name, donors.lr, ep), lam, mask="none", lr=donors.lr, epoch=ep, donor=model)
            for name, model in donors.candidates.items() for lam in p["sweep"].lams for ep in p["sweep"].epochs]


def sweep_deltas(p: Mapping) -> list[dict]:
    """Every delta a swept point adds to the post model, with the unmasked delta it was cut from (``source``):
    family graft (the graft delta), graft_<kind> (each mask at each rho), sft_merge (the SFT delta)."""
    sweep, ft = p["sweep"], p["finetune"]
    out = []
    for lr in ft.lrs:
        for ep in sweep.epochs:
            r = run_tag(lr, ep)
            graft = f"tensors/delta/graft_{r}"
            out.append({"family": GRAFT, "delta": graft, "source": graft, "lr": lr, "epoch": ep, "mask": "none",
                        "rho": None})
            out += [{"family": masked_method(kind), "delta": f"tensors/masked/{kind}_rho{rho}_{r}", "source": graft,
                     "lr": lr, "epoch": ep, "mask": kind, "rho": rho} for kind in sweep.masks for rho in sweep.rhos]
            sft = f"tensors/delta/sft_{r}"
            out.append({"family": SFT_MERGE, "delta": sft, "source": sft, "lr": lr, "epoch": ep, "mask": None,
                        "rho": None})
    return out




def proposed_points(p: Mapping, table) -> list[Point]:
    """The propose stage's chosen points (``table``: its candidates, a DataFrame), named by family and snapshot."""
    post, donor = p["models"].post, p["finetune"].donor
    pts = []
    for r in table[table.chosen].itertuples():
        graft = r.family.startswith("graft")
        pts.append(Point(f"{PROPOSED_PREFIX}{r.family}_{run_tag(r.lr, int(r.epoch))}", f"{PROPOSED_PREFIX}{r.family}",
                         post, r.delta, float(r.lam), None if r.rho is None or r.rho != r.rho else float(r.rho),
                         r.mask if graft else None, float(r.lr), int(r.epoch), donor=donor if graft else None))
    return pts


def find_point(points: Iterable[Point], name: str) -> Point:
    by_name = {pt.name: pt for pt in points}
    if name not in by_name:
        raise KeyError(f"point {name} is not in the sweep params.yaml declares (e.g. {sorted(by_name)[:3]})")
    return by_name[name]


def point_tensors(model: str | Path, delta: str | Path | None, lam: float | None) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream (name, tensor) of ``model + lam * delta`` one tensor at a time, in the model's dtype."""
    with TensorReader(model) as m:
        if delta is None:
            for name in m.names():
                yield name, m.get(name)
            return
        with TensorReader(delta) as d:
            same_tensors(m, d, "point")
            for name in m.names():
                if m.shape(name) != d.shape(name):
                    raise CheckpointError(f"tensor {name}: {model} shape {m.shape(name)} vs delta {d.shape(name)}")
                dt = d.get(name)
                if not all_finite(dt):
                    raise FloatingPointError(f"tensor {name} of {delta}: NaN or Inf")
                yield name, check_merged_finite(name, merge_tensor(m.get(name), dt, None, float(lam)))


def point_key(pt: Point, settings_key: str, memo: dict[str, str]) -> str:
    """What a point's scores depend on: its weights (by content), its coefficient, and the evaluation settings
    (params, data, code and engine versions, folded into ``settings_key``). Equal keys mean equal results."""
    blob = json.dumps({"weights": point_weights(pt, memo), "point": pt.as_dict(), "settings": settings_key},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def point_weights(pt: Point, memo: dict[str, str]) -> dict:
    """A point's weights by content: the model's and the delta's hashes, and the coefficient."""
    return {"model": content_hash(pt.model, memo), "delta": content_hash(pt.delta, memo) if pt.delta else None,
            "lam": pt.lam if pt.delta else None}


def kl_key(pt: Point, kl_settings_key: str, memo: dict[str, str]) -> str:
    """What a point's measured retention KL depends on: its weights and the KL settings (rollouts, code, device)."""
    blob = json.dumps({"weights": point_weights(pt, memo), "settings": kl_settings_key}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


POINT_LOADER = "graft.points.PointLoader"   # pass as worker_extension to open_generator to use load_point


class PointLoader:
    """Worker extension: streams a point's weights into the running model through ``reload_weights``. On vLLM each
    worker runs it (``reload_weights`` re-runs the backend's post-load processing, e.g. the CPU weight repacking;
    with tensor parallelism every worker reads the full tensors and keeps its shard); the HF generator runs the same
    method on itself."""

    def graft_load_point(self, model: str, delta: str | None, lam: float | None) -> None:
        self.reload_weights(weights_iterator=point_tensors(model, delta, lam))
