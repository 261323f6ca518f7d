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
