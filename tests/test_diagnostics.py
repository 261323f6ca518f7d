"""Weight-space diagnostics against closed forms on tiny checkpoints."""
from __future__ import annotations

import math

import pytest
import torch

from graft.diagnostics import delta_geometry, model_norm, relative_change
from graft.tensors import CheckpointError, save_tensors


def write(dir_, tensors):
    dir_.mkdir()
    save_tensors(dir_ / "model.safetensors", tensors)
    return dir_


def test_relative_change_and_norm(tmp_path):
    old = write(tmp_path / "old", {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([[0.0]])})
    new = write(tmp_path / "new", {"a": torch.tensor([3.0, 4.0 + 5.0]), "b": torch.tensor([[0.0]])})
    total, rows = relative_change(new, old)
    assert total == pytest.approx(1.0)                    # ||(0, 5)|| / ||(3, 4)||
    per = {r["tensor"]: r["relative_change"] for r in rows}
    assert per["a"] == pytest.approx(1.0) and math.isnan(per["b"])  # a zero tensor has no relative change
    assert model_norm(old) == pytest.approx(5.0)


def test_delta_geometry_cosine_over_the_whole_model(tmp_path):
    a = write(tmp_path / "a", {"x": torch.tensor([1.0, 0.0]), "y": torch.tensor([0.0])})
    b = write(tmp_path / "b", {"x": torch.tensor([1.0, 1.0]), "y": torch.tensor([-1.0])})
    g = delta_geometry(a, b)
    assert g["norm_a"] == pytest.approx(1.0) and g["norm_b"] == pytest.approx(math.sqrt(3))
    assert g["cosine"] == pytest.approx(1 / math.sqrt(3))
    assert delta_geometry(a, a)["cosine"] == pytest.approx(1.0)
    c = write(tmp_path / "c", {"x": torch.tensor([1.0, 0.0])})
    with pytest.raises(CheckpointError, match="different tensors"):
        delta_geometry(a, c)
