"""Pass@(k,T) against values worked out by hand from 1 - C(n-c, k) / C(n, k)."""

import math
from fractions import Fraction

import numpy as np
import pytest

from actors.evaluation.pass_at_k import pass_at_k, pass_at_k_t_grid, steps_to_success_grid

NAN = float("nan")


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 2 / 5),  # 1 - 3/5
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 4, 1.0),  # n - c = 3 < 4: every 4-subset holds a success
        (4, 0, 2, 0.0),
        (4, 4, 4, 1.0),
        (10, 3, 3, 85 / 120),  # 1 - C(7,3)/C(10,3) = 1 - 35/120
        (8, 1, 8, 1.0),
    ],
)
def test_single_task_matches_the_binomial_form(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_vectorised_over_tasks_with_different_sample_counts():
    values = pass_at_k([5, 5, 10, 4], [2, 0, 3, 1], 2)
    np.testing.assert_allclose(values, [7 / 10, 0.0, 1 - 21 / 45, 1 - 3 / 6], atol=1e-12)


def test_large_n_is_stable_where_the_binomials_overflow_floats():
    n, c, k = 2000, 1000, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert float(math.comb(n, k)) > 1e150  # float64 division of the binomials would lose everything
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000, rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 1, 4), (3, 4, 1), (3, -1, 1), (3, 1, 0)])
def test_impossible_inputs_are_refused(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_grid_over_k_and_step_budget_by_hand():
    # Two tasks, three episodes each: the step at which each episode won (NaN: it failed).
    steps = np.array([[2, NAN, 5], [NAN, NAN, 1]])
    np.testing.assert_array_equal(steps_to_success_grid(steps, [2, 5]), [[1, 1], [2, 1]])
    grid = pass_at_k_t_grid(steps, ks=[1, 2], budgets=[2, 5])
    # T=2: c = (1, 1); T=5: c = (2, 1).
    # k=1: mean(1/3, 1/3), mean(2/3, 1/3). k=2: 1 - C(2,2)/C(3,2) = 2/3 each; at T=5 task 1 has n-c=1<2 -> 1.
    np.testing.assert_allclose(grid, [[1 / 3, 1 / 2], [2 / 3, (1 + 2 / 3) / 2]], atol=1e-12)


def test_grid_is_monotone_in_k_and_in_budget():
    rng = np.random.default_rng(0)
    steps = np.where(rng.random((20, 8)) < 0.3, rng.integers(1, 30, (20, 8)), np.nan)
    grid = pass_at_k_t_grid(steps, ks=[1, 2, 4, 8], budgets=[5, 10, 20, 30])
    assert np.all(np.diff(grid, axis=0) >= -1e-12) and np.all(np.diff(grid, axis=1) >= -1e-12)
    # Pass@1 at the full budget is just the success rate.
    assert grid[0, -1] == pytest.approx(np.mean(~np.isnan(steps)))
