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
