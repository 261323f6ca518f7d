"""The donor sweep: its params checks, its points, and the pure functions the donor_choice stage ranks donors with
(the stage itself runs in the end-to-end test)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml

from graft.donor_choice import (epoch_losses, frontier_scores, hypervolume, rank_agreement, spearman,
                                summary_metrics)
from graft.params import ParamsError
from graft.points import sweep_points
from graft.registry import DONOR_METHOD
from graft.schema import validate
from tests.conftest import REPO


def raw_params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_hypervolume_is_the_dominated_area_above_the_reference():
    # (0.5, 0.5) and (0.2, 0.8): 0.5 * 0.5 + 0.2 * (0.8 - 0.5); a dominated point and one below the reference add 0
    assert hypervolume([(0.5, 0.5), (0.2, 0.8), (0.1, 0.1), (0.9, -0.1)]) == pytest.approx(0.31)
    assert hypervolume([(0.2, 0.8), (0.5, 0.5)]) == hypervolume([(0.5, 0.5), (0.2, 0.8)])
    assert hypervolume([]) == 0.0
    assert hypervolume([(1.0, 1.0)], ref=(0.5, 0.5)) == pytest.approx(0.25)
    # a point that moves right grows the area
    assert hypervolume([(0.6, 0.5), (0.2, 0.8)]) > hypervolume([(0.5, 0.5), (0.2, 0.8)])


def test_spearman_against_hand_computed_ranks():
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    # ties share their mean rank: x ranks (1.5, 1.5, 3) against (1, 2, 3): 1.5 / sqrt(1.5 * 2)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    assert spearman([1.0], [2.0]) is None and spearman([1, 1], [1, 2]) is None
    assert spearman([1, float("nan")], [1, 2]) is None
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_epoch_losses_average_each_epochs_steps():
    curve = [{"epoch": 1, "loss": 2.0, "step": 1}, {"epoch": 1, "loss": 1.0, "step": 2},
             {"epoch": 2, "loss": 0.5, "step": 3}]
    assert epoch_losses(curve) == {1: 1.5, 2: 0.5}


def test_frontier_scores_and_rank_agreement():
    pts = pd.DataFrame({"new_task": [0.2, 0.6], "old_task": [0.6, 0.4]})
    got = frontier_scores(pts, (0.0, 0.7))
    # post (0, 0.7) adds nothing right of 0: 0.6 * 0.4 + 0.2 * (0.6 - 0.4)
    assert got["hypervolume"] == pytest.approx(0.28) and got["best_new_task"] == 0.6
    assert got["old_task_at_best"] == 0.4 and got["n_points"] == 2
    empty = frontier_scores(pts.iloc[:0], (0.0, 0.7))
    assert math.isnan(empty["hypervolume"]) and empty["n_points"] == 0
    table = pd.DataFrame({"donor": ["a", "b", "c", "d"], "lr": [1e-4] * 3 + [1e-3], "epoch": [2, 2, 2, 2],
                          "train_loss": [0.3, 0.2, 0.1, 0.5], "delta_norm": [1.0, 2.0, 3.0, 1.0],
                          "cosine_post": [0.1, 0.3, 0.2, 0.0], "predicted_kl_diagonal": [3.0, 2.0, 1.0, 1.0],
                          "predicted_kl_kfac": [1.0, 1.0, 2.0, 1.0], "hypervolume": [0.1, 0.2, 0.3, 0.4]})
    (row,) = rank_agreement(table)   # the lr 1e-3 snapshot has one donor: nothing to rank
    assert row["donors"] == ["a", "b", "c"] and row["order_by_hypervolume"] == ["c", "b", "a"]
    assert row["spearman_train_loss"] == pytest.approx(-1.0) and row["spearman_delta_norm"] == pytest.approx(1.0)
    assert row["spearman_cosine_post"] == pytest.approx(0.5)
    assert row["spearman_predicted_kl_kfac"] == pytest.approx(spearman([1, 1, 2], [0.1, 0.2, 0.3]))


def test_candidates_become_points_that_read_their_stage_outputs():
    p = validate(raw_params())
    pts = [pt for pt in sweep_points(p) if pt.method == DONOR_METHOD]
    lams, epochs = p["sweep"].lams, p["sweep"].epochs
    assert len(pts) == len(p["donors"].candidates) * len(lams) * len(epochs) > 0
    pt = pts[0]
    name = next(iter(p["donors"].candidates))
    assert pt.delta == f"tensors/delta/candidate_{name}/lr{p['donors'].lr}_ep{epochs[0]}"
    assert pt.donor == p["donors"].candidates[name] and pt.model == p["models"].post and pt.mask == "none"
    text = (REPO / "dvc.yaml").read_text()
    assert "tensors/delta/candidate_${key}" in text and "models/finetuned/candidate_${key}" in text
    raw = raw_params()
    raw["donors"]["candidates"] = {}
    assert not [pt for pt in sweep_points(validate(raw)) if pt.method == DONOR_METHOD]


@pytest.mark.parametrize("candidates, expect", [
    ({"base": "models/world/base"}, "donors.candidates.base is finetune.donor"),
    ({"p": "models/world/post"}, "donors.candidates.p is models.post"),
    ({"a": "models/world/pretrain_0", "b": "models/world/pretrain_0/"}, "donors.candidates.b and donors.candidates.a"),
    ({"../up": "models/world/pretrain_0"}, "donors.candidates key '../up'"),
    ({"a": ""}, "donors.candidates.a must be non-empty"),
])
def test_bad_candidates_fail_naming_the_key(candidates, expect):
    raw = raw_params()
    raw["donors"]["candidates"] = candidates
    with pytest.raises(ParamsError) as e:
        validate(raw)
    assert expect in str(e.value)


def test_summary_metrics_are_one_namespaced_dict_per_snapshot():
    table = pd.DataFrame({"donor": ["finetune.donor", "b", "a"], "lr": [1e-4, 1e-4, 1e-3], "epoch": [2, 2, 2],
                          "train_loss": [0.3, 0.2, 0.1], "delta_norm": [1.0, 2.0, 3.0],
                          "cosine_post": [0.1, 0.3, 0.2], "predicted_kl_diagonal": [3.0, 2.0, 1.0],
                          "predicted_kl_kfac": [1.0, 1.0, 2.0], "hypervolume": [0.1, 0.2, 0.3]})
    got = summary_metrics(table)
    assert list(got) == ["donor_choice"] and sorted(got["donor_choice"]) == ["lr0.0001_ep2", "lr0.001_ep2"]
    two = got["donor_choice"]["lr0.0001_ep2"]
    assert two["hypervolume"] == {"finetune.donor": 0.1, "b": 0.2} and two["order_by_hypervolume"] == "b > finetune.donor"
    assert two["spearman"]["train_loss"] == pytest.approx(-1.0) and two["spearman"]["predicted_kl_kfac"] is None
    assert got["donor_choice"]["lr0.001_ep2"] == {"hypervolume": {"a": 0.3}}   # one donor: nothing to rank
    json.dumps(got, allow_nan=False)
    unmeasured = summary_metrics(table.assign(hypervolume=[float("nan"), 0.2, 0.3]))
    assert unmeasured["donor_choice"]["lr0.0001_ep2"]["hypervolume"]["finetune.donor"] is None
