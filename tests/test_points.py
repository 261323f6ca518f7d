"""Sweep points as weights: names, the in-place weight stream, and the keys that decide what is re-evaluated."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from graft.merging import merge_into_dir
from graft.hashing import content_hash
from graft.points import find_point, point_key, point_tensors, sweep_points
from graft.schema import validate
from safetensors.torch import save_file

from graft.tensors import CheckpointError, TensorReader, write_like

REPO = Path(__file__).resolve().parents[1]


def params(**sweep):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["sweep"].update(sweep)
    raw["finetune"]["lrs"] = [0.001]
    return validate(raw)


def test_sweep_points_cover_the_grid_with_the_dvc_names():
    p = params(lams=[0.5, 1.0], rhos=[0.05, 0.1], masks=["diagonal", "kfac"])
    pts = sweep_points(p)
    names = [pt.name for pt in pts]
    assert len(names) == len(set(names))
    n_runs = len(p["finetune"].lrs) * len(p["sweep"].epochs)
    graft_masked = [pt for pt in pts if pt.mask in ("diagonal", "kfac", "random")]
    assert len(graft_masked) == 2 * 2 * 2 * n_runs
    pt = find_point(pts, "graft_kfac_lam1.0_rho0.1_lr0.001_ep10")
    assert (pt.model, pt.delta, pt.lam, pt.rho, pt.mask) == (
        p["models"].post, "tensors/masked/kfac_rho0.1_lr0.001_ep10", 1.0, 0.1, "kfac")
    assert find_point(pts, "sft_merge_lam0.5_lr0.001_ep10").delta == "tensors/delta/sft_lr0.001_ep10"
    assert find_point(pts, "post").delta is None
    with pytest.raises(KeyError, match="not in the sweep"):
        find_point(pts, "graft_lam0.7_lr0.001_ep10")


def test_every_point_name_matches_a_stage_output_path_in_dvc_yaml():
    """dvc.yaml spells the delta/mask/model paths the points read; a renamed stage output would break this."""
    text = (REPO / "dvc.yaml").read_text()
    for pattern in ("tensors/delta/graft_lr${item.lr}_ep${item.epoch}",
                    "tensors/delta/sft_lr${item.lr}_ep${item.epoch}",
                    "tensors/masked/${item.kind}_rho${item.rho}_lr${item.lr}_ep${item.epoch}",
                    "models/merged/fisher_merge_lam${item.lam}_lr${item.lr}_ep${item.epoch}",
                    "models/opsd/alpha${item.alpha}_lr${item.lr}", "models/finetuned/sft_lr${item}"):
        assert pattern in text, pattern


@pytest.fixture()
def dirs(tmp_path, tiny_model_dir):
    delta = tmp_path / "delta"
    with TensorReader(tiny_model_dir) as r:
        gen = torch.Generator().manual_seed(0)
        write_like(r, delta, torch.float32, lambda name: torch.randn(r.shape(name), generator=gen) * 1e-2)
    return tiny_model_dir, delta


def test_point_tensors_are_bitwise_the_merged_directory(dirs, tmp_path):
    model, delta = dirs
    (tmp_path / "merged").mkdir()
    merge_into_dir(model, delta, 0.3, tmp_path / "merged")
    streamed = dict(point_tensors(model, delta, 0.3))
    with TensorReader(tmp_path / "merged") as m:
        assert set(streamed) == set(m.names())
        for name in m.names():
            assert torch.equal(streamed[name], m.get(name)), name
    with TensorReader(model) as m:  # no delta: the model as it is
        assert all(torch.equal(t, m.get(n)) for n, t in point_tensors(model, None, None))


def test_point_tensors_refuse_nan_and_a_different_tensor_set(dirs, tmp_path):
    model, delta = dirs
    with TensorReader(delta) as r:
        first = r.names()[0]
        write_like(r, tmp_path / "nan", torch.float32,
                   lambda n: torch.full(r.shape(n), float("nan")) if n == first else r.get(n))
        (tmp_path / "fewer").mkdir()
        save_file({n: r.get(n) for n in r.names()[1:]}, str(tmp_path / "fewer" / "model.safetensors"))
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        list(point_tensors(model, tmp_path / "nan", 0.5))
    with pytest.raises(CheckpointError, match="different tensors"):
        list(point_tensors(model, tmp_path / "fewer", 0.5))


def test_point_key_moves_with_weights_lambda_and_settings(dirs, tmp_path):
    model, delta = dirs
    pts = sweep_points(params())
    pt = find_point(pts, "graft_lam0.5_lr0.001_ep10")
    pt = type(pt)(**{**pt.as_dict(), "model": str(model), "delta": str(delta)})
    memo: dict[str, str] = {}
    k = point_key(pt, "settings-a", memo)
    assert k == point_key(pt, "settings-a", {})                       # deterministic, memo or not
    assert k != point_key(pt, "settings-b", {})                       # evaluation params/data/code
    assert k != point_key(type(pt)(**{**pt.as_dict(), "lam": 0.75}), "settings-a", {})
    before = content_hash(delta)
    shard = sorted(Path(delta).glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))  # one bit of the weights
    assert content_hash(delta) != before and point_key(pt, "settings-a", {}) != k
