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
