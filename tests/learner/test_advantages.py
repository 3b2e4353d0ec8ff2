"""step_level_advantages against hand-computed numbers (GiGPO semantics as in verl-agent)."""

import numpy as np
import pytest

from learner.advantages import advantage_parts, discounted_returns, step_level_advantages

# One task group "g", two trajectories, gamma 0.5 so the arithmetic stays exact:
#   e1: A -> B, rewards 0, 1     (success, total 1)
#   e2: A -> C -> B, rewards 0, 0, 0 (failure, total 0)
# Anchor groups within g: A = {e1s0, e2s0}, B = {e1s1, e2s2}, C = {e2s1} (singleton).
# Returns (gamma 0.5): e1s0 0.5, e1s1 1; e2 all 0.
GROUPS = ["g"] * 5
EPISODES = ["e1", "e1", "e2", "e2", "e2"]
STEPS = [0, 1, 0, 1, 2]
ANCHORS = ["A", "B", "A", "C", "B"]
REWARDS = [0.0, 1.0, 0.0, 0.0, 0.0]


def adv(invalid=None, **kwargs):
    return step_level_advantages(GROUPS, EPISODES, STEPS, ANCHORS, REWARDS, invalid, gamma=0.5, **kwargs)


def test_mean_norm_per_step():
    # Episode: scores [1,1,0,0,0], mean 0.4 -> +0.6 / -0.4. Step: A +-0.25, B +-0.5, C 0.
    np.testing.assert_allclose(adv(), [0.85, 1.1, -0.65, -0.4, -0.9])


def test_mean_norm_per_trajectory():
    # Episode statistics over one value per trajectory [1, 0]: mean 0.5 -> +-0.5.
    np.testing.assert_allclose(adv(episode_stats="per_trajectory"), [0.75, 1.0, -0.75, -0.5, -1.0])


def test_mean_std_norm_per_step():
    # Episode: std of [1,1,0,0,0] (unbiased) = sqrt(1.2/4) = sqrt(0.3).
    # Step: A {0.5, 0}: std sqrt(0.125) -> +-0.25/0.353553 = +-0.707107; B {1, 0}: +-0.5/0.707107.
    eps = 1e-6
    up, down = 0.6 / (np.sqrt(0.3) + eps), -0.4 / (np.sqrt(0.3) + eps)
    a = 0.25 / (np.sqrt(0.125) + eps)
    b = 0.5 / (np.sqrt(0.5) + eps)
    expected = [up + a, up + b, down - a, down, down - b]
    np.testing.assert_allclose(adv(mode="mean_std_norm"), expected, rtol=1e-12)
    np.testing.assert_allclose(expected, [1.802552, 1.802552, -1.437403, -0.730297, -1.437403], atol=1e-5)


def test_mean_std_norm_per_trajectory():
    # [1, 0]: mean 0.5, std sqrt(0.5) -> +-0.707107 for every row of the trajectory.
    e = 0.5 / (np.sqrt(0.5) + 1e-6)
    a = 0.25 / (np.sqrt(0.125) + 1e-6)
    b = 0.5 / (np.sqrt(0.5) + 1e-6)
    result = adv(mode="mean_std_norm", episode_stats="per_trajectory")
    np.testing.assert_allclose(result, [e + a, e + b, -e - a, -e, -e - b], rtol=1e-12)


def test_omega_zero_is_grpo():
    np.testing.assert_allclose(adv(omega=0.0), [0.6, 0.6, -0.4, -0.4, -0.4])
    np.testing.assert_allclose(adv(omega=0.5), [0.725, 0.85, -0.525, -0.4, -0.65])


def test_invalid_penalty_hits_only_its_row():
    # e2s1 invalid: its score 0 - 0.1; scores [1,1,0,-0.1,0], mean 0.38.
    # Its return is 0 - 0.1 but e2s0's return stays 0 (the penalty is not carried back);
    # e2s1 is a singleton anchor, so the step parts are the same as without the penalty.
    result = adv(invalid=[False, False, False, True, False])
    np.testing.assert_allclose(result, [0.87, 1.12, -0.63, -0.48, -0.88])
    parts = advantage_parts(GROUPS, EPISODES, STEPS, ANCHORS, REWARDS, [False, False, False, True, False], gamma=0.5)
    np.testing.assert_allclose(parts.returns, [0.5, 1.0, 0.0, -0.1, 0.0])


def test_invalid_first_step_per_trajectory_and_in_anchor_group():
    # e2s0 invalid (penalty 0.2): trajectory values [1, -0.2] (first step's score), mean 0.4.
    # Episode: e1 rows 0.6; e2s0 -0.2-0.4 = -0.6; e2s1, e2s2 -0.4.
    # Returns: e2s0 -0.2, so anchor A = {0.5, -0.2}: mean 0.15 -> +0.35 / -0.35.
    result = adv(invalid=[False, False, True, False, False], invalid_penalty=0.2, episode_stats="per_trajectory")
    np.testing.assert_allclose(result, [0.95, 1.1, -0.95, -0.4, -0.9])


def test_singletons():
    # A group with one row: mean 0, std 1 -> its score; its anchor group is a singleton -> 0.
    # The same anchor text in another task group is another anchor group.
    groups, episodes, steps, anchors, rewards = (
        GROUPS + ["h"],
        EPISODES + ["e1"],
        STEPS + [0],
        ANCHORS + ["A"],
        REWARDS + [1.0],
    )
    result = step_level_advantages(groups, episodes, steps, anchors, rewards, gamma=0.5)
    np.testing.assert_allclose(result, [0.85, 1.1, -0.65, -0.4, -0.9, 1.0])
    result = step_level_advantages(groups, episodes, steps, anchors, rewards, gamma=0.5, mode="mean_std_norm")
    assert result[-1] == pytest.approx(1.0 / (1.0 + 1e-6))
    parts = advantage_parts(groups, episodes, steps, anchors, rewards, gamma=0.5)
    assert parts.anchor_group_size.tolist() == [2, 2, 2, 1, 2, 1]


def test_rows_in_any_order():
    rng = np.random.default_rng(0)
    order = rng.permutation(5)
    invalid = [False, False, True, False, False]
    columns = (GROUPS, EPISODES, STEPS, ANCHORS, REWARDS, invalid)
    shuffled = [np.asarray(column, dtype=object)[order].tolist() for column in columns]
    for kwargs in ({}, {"mode": "mean_std_norm", "episode_stats": "per_trajectory"}):
        result = step_level_advantages(*shuffled, gamma=0.5, **kwargs)
        np.testing.assert_allclose(result, adv(invalid, **kwargs)[order], rtol=1e-12)


def test_discounted_returns_default_gamma():
    returns = discounted_returns(np.array([0, 0, 0]), np.array([2, 0, 1]), np.array([1.0, 0.0, 0.0]), 0.95)
    np.testing.assert_allclose(returns, [1.0, 0.9025, 0.95])


def test_duplicate_step_is_an_error():
    with pytest.raises(ValueError, match="repeats a step index"):
        step_level_advantages(["g", "g"], ["e", "e"], [0, 0], ["A", "B"], [0.0, 1.0])


def test_bad_mode_is_an_error():
    with pytest.raises(ValueError, match="mode"):
        adv(mode="std")
