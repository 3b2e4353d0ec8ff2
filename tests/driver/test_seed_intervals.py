"""Seed-level t intervals on hand-computed cases (t quantiles from tables: t(0.975, 1) = 12.706,
t(0.975, 2) = 4.303, t(0.975, 7) = 2.365)."""

import math

import pytest

from driver.seed_intervals import minus_estimate, over_seeds, seed_difference, t_quantile, welch


def test_t_quantiles_are_the_tables():
    assert t_quantile(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(7) == pytest.approx(2.3646, abs=1e-4)


def test_one_arm_is_mean_plus_minus_t_sd_over_root_n():
    # 0.2, 0.3, 0.4: mean 0.3, sd 0.1, standard error 0.1 / sqrt(3) = 0.057735; x 4.3027 = 0.248414.
    value = over_seeds([0.2, 0.3, 0.4])
    assert value.mean == pytest.approx(0.3) and value.seeds == 3 and value.df == 2 and value.method == "t"
    assert value.half_width == pytest.approx(0.248414, abs=1e-6)
    assert (value.low, value.high) == pytest.approx((0.051586, 0.548414), abs=1e-6)


def test_one_seed_has_no_interval():
    value = over_seeds([0.375])
    assert (value.mean, value.half_width, value.low, value.high, value.seeds) == (0.375, None, None, None, 1)


def test_the_same_seeds_pair_by_seed():
    # Per seed: 0.4 - 0.3, 0.3 - 0.3, 0.5 - 0.3 = 0.1, 0.0, 0.2: mean 0.1, sd 0.1, half-width as above.
    first = {0: 0.4, 1: 0.3, 2: 0.5}
    second = {2: 0.3, 0: 0.3, 1: 0.3}
    value = seed_difference(first, second)
    assert value.method == "paired" and value.seeds == 3 and value.df == 2
    assert value.mean == pytest.approx(0.1) and value.half_width == pytest.approx(0.248414, abs=1e-6)


def test_pairing_takes_out_what_a_seed_does_to_both_arms():
    # Seed 1 is hard for both arms (0.1 and 0.0), the others easy: each seed's difference is 0.1, so the
    # paired interval is 0 wide, where the arms' own spreads (sd 0.3) would give an unpaired one 1.2 wide.
    first, second = {0: 0.7, 1: 0.1, 2: 0.7}, {0: 0.6, 1: 0.0, 2: 0.6}
    assert seed_difference(first, second).half_width == pytest.approx(0.0, abs=1e-12)
    assert welch(list(first.values()), list(second.values())).half_width > 0.5


def test_a_pair_of_one_shared_seed_has_no_interval():
    value = seed_difference({0: 0.4}, {0: 0.3})
    assert value.method == "paired" and value.seeds == 1 and value.half_width is None
    assert value.mean == pytest.approx(0.1)


def test_different_seeds_take_welch_with_satterthwaites_degrees_of_freedom():
    # 0.1, 0.3 against 0.0, 0.2: means 0.2 and 0.1, variances 0.02 each, squared standard error
    # 0.02/2 + 0.02/2 = 0.02; df = 0.02^2 / (0.01^2/1 + 0.01^2/1) = 2; half-width 4.302653 x 0.141421 = 0.608487.
    value = seed_difference({0: 0.1, 1: 0.3}, {2: 0.0, 3: 0.2})
    assert value.method == "Welch" and value.df == pytest.approx(2.0) and value.seeds == 2
    assert value.mean == pytest.approx(0.1) and value.half_width == pytest.approx(0.608487, abs=1e-6)


def test_welch_with_unequal_arms():
    # 0.2, 0.4 (variance 0.02, n 2) against 0.1, 0.2, 0.3 (variance 0.01, n 3): terms 0.01 and 0.003333,
    # squared standard error 0.013333; df = 0.013333^2 / (0.01^2/1 + 0.003333^2/2) = 1.684211.
    value = welch([0.2, 0.4], [0.1, 0.2, 0.3])
    assert value.mean == pytest.approx(0.1) and value.df == pytest.approx(1.684211, abs=1e-6)
    assert value.half_width == pytest.approx(t_quantile(1.684211) * math.sqrt(0.0133333), rel=1e-4)
    assert 4.3027 * 0.11547 < value.half_width < 12.7062 * 0.11547  # between the t of 2 and of 1 df


def test_welch_with_one_run_in_an_arm_has_no_interval():
    value = welch([0.3], [0.1, 0.2, 0.3])
    assert value.half_width is None and value.seeds == 1 and value.mean == pytest.approx(0.1)


def test_welch_of_arms_whose_runs_all_agree_is_zero_wide():
    value = welch([0.365, 0.365], [0.24, 0.24])
    assert value.half_width == 0.0 and value.mean == pytest.approx(0.125)


def test_an_arm_against_an_exact_base_figure_is_its_runs_minus_it():
    # 0.375, 0.25, 0.385 (36, 24, 37 of 96) minus the base model's 0.24 (23 of 96): 13, 1, 14 of 96;
    # mean 28/3 / 96 = 0.097222; sd of (13, 1, 14) = sqrt(((11/3)^2 + (25/3)^2 + (14/3)^2) / 2) = 7.234178,
    # so 7.234178 / 96 / sqrt(3) x 4.3027 = 0.187198.
    value = minus_estimate([36 / 96, 24 / 96, 37 / 96], 23 / 96)
    assert value.mean == pytest.approx(0.097222, abs=1e-6) and value.seeds == 3 and value.df == 2
    assert value.half_width == pytest.approx(0.187198, abs=1e-5)


def test_the_base_figures_evaluation_noise_widens_the_interval():
    # Runs 0.5 and 0.25 against 0.25 measured with variance 0.01 on 48 degrees of freedom: seed term
    # 0.03125 / 2 = 0.015625, squared standard error 0.025625 (0.160078); df = 0.025625^2 /
    # (0.015625^2 / 1 + 0.01^2 / 48) = 6.5664e-4 / 2.4622e-4 = 2.6669.
    value = minus_estimate([0.5, 0.25], 0.25, other_variance=0.01, other_df=48)
    assert value.mean == pytest.approx(0.125) and value.df == pytest.approx(2.6669, abs=1e-4)
    assert value.half_width == pytest.approx(t_quantile(2.6669) * 0.160078, rel=1e-4)
    assert value.half_width < 12.7062 * 0.160078  # more degrees of freedom than the runs' 1 alone
    assert minus_estimate([0.5], 0.25, other_variance=0.01).half_width is None  # one run: no seed spread
