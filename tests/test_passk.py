from itertools import combinations

import pytest

from graft.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_pass_at_k_equals_enumeration_over_subsets(n):
    for c in range(n + 1):
        grades = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(range(n), k))
            brute = sum(any(grades[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_1_is_the_mean():
    assert mean_pass_at_k([0, 1, 4], 4, 1) == pytest.approx((0 + 0.25 + 1) / 3)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
