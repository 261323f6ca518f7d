import pytest

from graft.pareto import frontier_dominates, non_dominated


def test_non_dominated_keeps_the_frontier_only():
    assert non_dominated([(0.1, 0.9), (0.5, 0.5), (0.4, 0.4), (0.5, 0.5)]) == [True, True, False, True]


def test_frontier_dominates_needs_every_point_covered_and_one_strictly():
    graft = [(0.3, 0.9), (0.6, 0.5)]
    assert frontier_dominates(graft, [(0.3, 0.8), (0.5, 0.5)])
    assert not frontier_dominates(graft, [(0.3, 0.8), (0.7, 0.1)])     # (0.7, 0.1) is not covered
    assert not frontier_dominates(graft, graft)                          # equal sets: no dominance
    assert frontier_dominates(graft + [(0.0, 1.0)], [(0.0, 1.0), (0.2, 0.9)])   # a shared point plus a better one
    assert not frontier_dominates([(0.3, 0.8)], [(0.3, 0.8)])
    with pytest.raises(ValueError, match="non-empty"):
        frontier_dominates([], [(0.1, 0.1)])


def test_frontier_dominates_beyond_a_margin():
    sft_merge = [(0.0, 0.66), (0.00, 0.36), (0.00, 0.02)]
    graft = [(0.0, 0.66), (0.00, 0.36), (0.01, 0.03)]          # one sample better: dominance, but not beyond noise
    assert frontier_dominates(graft, sft_merge)
    assert not frontier_dominates(graft, sft_merge, margin=(0.09, 0.06))
    assert frontier_dominates(graft + [(0.30, 0.60)], sft_merge, margin=(0.09, 0.06))
    # within the margin a point may fall short and still cover
    assert frontier_dominates([(0.28, 0.62), (0.5, 0.5)], [(0.3, 0.6), (0.2, 0.3)], margin=(0.05, 0.05))


def test_pareto_axis_names_what_the_new_task_measures():
    from stages.report import new_task_axis
    assert "injected facts" in new_task_axis("knowledge") and "greedy" in new_task_axis("knowledge")
    for source in ("teacher", "star", "synthself", "external"):
        assert "mined problems" in new_task_axis(source)


def test_the_report_draws_both_declared_figures_without_interpolation_points(tmp_path):
    """reports/pareto.png and reports/diagnostics/interpolation.png are declared outputs of the report stage, so a
    run with `diagnostics.interpolation: []` (no base_to_post points) must still write both (a real run failed
    there: the interpolation figure was drawn only when such points existed)."""
    import pandas as pd

    from graft.registry import DIAGNOSTIC
    from stages.report import draw_figures
    from tests.conftest import REPO

    df = pd.read_parquet(REPO / "research/real/hard_short-seed1/points.parquet")
    assert (df.method == DIAGNOSTIC).any()
    for name, rows in (("with", df), ("without", df[df.method != DIAGNOSTIC])):
        draw_figures(rows, "teacher", tmp_path / name)
        for fig in ("pareto.png", "diagnostics/interpolation.png"):
            assert (tmp_path / name / fig).stat().st_size > 1000, (name, fig)


def test_the_headline_takes_each_methods_best_balanced_point_in_registry_order():
    import pandas as pd

    from graft.headline import headline

    df = pd.DataFrame([
        {"name": "sft_a", "method": "sft", "new_task": 0.9, "old_task": 0.1, "retention_kl": 0.5},
        {"name": "graft_kfac_b", "method": "graft_kfac", "new_task": 0.5, "old_task": 0.6, "retention_kl": 0.02},
        {"name": "graft_kfac_a", "method": "graft_kfac", "new_task": 0.6, "old_task": 0.5, "retention_kl": 0.01},
        {"name": "graft_kfac_c", "method": "graft_kfac", "new_task": 0.7, "old_task": 0.2, "retention_kl": 0.001},
        {"name": "post", "method": "post", "new_task": 0.0, "old_task": 0.7, "retention_kl": 0.0},
        {"name": "base_to_post_t0.5", "method": "base_to_post", "new_task": 1.0, "old_task": 1.0, "retention_kl": 1.0},
        {"name": "proposed_graft_kfac_x", "method": "proposed_graft_kfac", "new_task": 0.1, "old_task": 0.6,
         "retention_kl": 0.01},
    ])
    h = headline(df)
    assert list(h) == ["post", "sft", "graft_kfac", "proposed_graft_kfac"]   # diagnostics left out
    # graft_kfac_a and _b tie on the mean (0.55): the lower retention KL wins
    assert h["graft_kfac"] == {"point": "graft_kfac_a", "new_task": 0.6, "old_task": 0.5, "retention_kl": 0.01}
    assert h["sft"]["point"] == "sft_a" and h["post"]["retention_kl"] == 0.0


def test_every_method_has_its_own_colour_and_marker():
    from graft.figures import method_style
    from graft.registry import METHODS

    looks = {(tuple(method_style(m)["color"]) if not isinstance(method_style(m)["color"], str)
              else method_style(m)["color"], method_style(m)["marker"]) for m in METHODS}
    assert len(looks) == len(METHODS)
    assert method_style("proposed_graft_kfac")["color"] == method_style("graft_kfac")["color"]
    assert method_style("proposed_graft_kfac")["marker"] == "*"
