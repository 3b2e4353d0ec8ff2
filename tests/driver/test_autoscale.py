"""The autoscale decision on hand-computed intervals (driver/autoscale.py)."""

import pytest

from driver.autoscale import PoolSignals, decide, throttled_fraction
from driver.pool_control import held_back_seconds
from slea.config import AutoscaleConfig, ConfigError, load_config

POLICY = AutoscaleConfig(min_workers=1, max_workers=4, grow_wait_fraction=0.25, shrink_throttled_fraction=0.5)


def signals(**changes) -> PoolSignals:
    """A balanced interval of 2 workers: 3 learner steps of 10 s training and 2 s waiting each, no throttling."""
    base = dict(desired=2, alive=2, learner_steps=3, learner_wait_s=6.0, learner_train_s=30.0, throttled_fraction=0.0)
    return PoolSignals(**{**base, **changes})


def test_a_balanced_pool_holds():
    decision = decide(signals(), POLICY)  # waited 6 / 36 = 17% < 25%
    assert (decision.kind, decision.workers) == ("hold", 2)


def test_a_waiting_learner_grows_the_pool_by_one_step():
    decision = decide(signals(learner_wait_s=15.0), POLICY)  # 15 / 45 = 33% > 25%
    assert (decision.kind, decision.workers) == ("grow", 3)
    assert "33%" in decision.reason
    big_steps = AutoscaleConfig(min_workers=1, max_workers=4, step=3)
    assert decide(signals(learner_wait_s=15.0), big_steps).workers == 4  # 2 + 3, capped at max_workers


def test_growth_stops_at_max_workers_and_while_workers_start():
    assert decide(signals(desired=4, alive=4, learner_wait_s=30.0), POLICY).kind == "hold"
    starting = decide(signals(desired=3, alive=2, learner_wait_s=30.0), POLICY)  # the third is still loading
    assert (starting.kind, starting.workers) == ("hold", 3) and "1 worker(s) still starting" in starting.reason


def test_throttled_actors_shrink_the_pool_even_while_workers_start():
    decision = decide(signals(desired=3, alive=2, throttled_fraction=0.6), POLICY)
    assert (decision.kind, decision.workers) == ("shrink", 2)
    assert decide(signals(desired=1, alive=1, throttled_fraction=0.9), POLICY).kind == "hold"  # min_workers
    assert decide(signals(throttled_fraction=0.5), POLICY).kind == "hold"  # at the threshold: not over it


def test_shrinking_wins_over_a_waiting_learner():
    decision = decide(signals(learner_wait_s=100.0, throttled_fraction=0.8), POLICY)
    assert (decision.kind, decision.workers) == ("shrink", 1)


def test_no_learner_step_is_no_evidence():
    assert decide(signals(learner_steps=0, learner_wait_s=0.0, learner_train_s=0.0), POLICY).kind == "hold"


def test_a_size_outside_the_bounds_is_brought_back():
    assert (decide(signals(desired=0, alive=0), POLICY).workers, decide(signals(desired=9), POLICY).workers) == (1, 4)


def test_throttled_fraction_counts_workers_present_at_both_ends():
    # Over 10 s: worker 0 was held back 4 s, worker 1 6 s; worker 2 joined during the interval and worker 3
    # restarted (its count began again): neither tells what the interval was like.
    before = {0: 10.0, 1: 0.0, 3: 50.0}
    after = {0: 14.0, 1: 6.0, 2: 3.0, 3: 2.0}
    assert throttled_fraction(before, after, 10.0) == pytest.approx((4 + 6) / (2 * 10))
    assert throttled_fraction({}, after, 10.0) == 0.0
    assert (
        throttled_fraction({0: 0.0}, {0: 30.0}, 10.0) == 1.0
    )  # summaries are read a moment apart: capped at all of the time


def test_waits_at_the_runs_end_are_not_held_back():
    # Over 10 s two workers each waited 8 s more at their gate, worker 1's 6 s of it because the updates
    # left until learner.max_steps had their groups (reason run_end): held back (8 + 2) / 20 = 0.5, not 0.8.
    before = held_back_seconds([summary(0, 2.0, 0.0), summary(1, 1.0, 1.0)])
    after = held_back_seconds([summary(0, 10.0, 0.0), summary(1, 9.0, 7.0)])
    assert before == {0: 2.0, 1: 0.0} and after == {0: 10.0, 1: 2.0}
    assert throttled_fraction(before, after, 10.0) == pytest.approx(0.5)


def summary(worker: int, throttled_s: float, run_end_s: float) -> dict:
    """The fields of a worker's summary (actors/worker.py) the autoscaler reads."""
    return {"worker": worker, "throttled_s": throttled_s, "run_end_s": run_end_s}


def test_autoscale_config_is_off_by_default_and_checks_its_bounds():
    assert load_config("configs/local.yaml").actors.autoscale is None
    config = load_config("configs/local.yaml", ["actors.autoscale.max_workers=3"])
    assert (config.actors.autoscale.min_workers, config.actors.autoscale.max_workers) == (1, 3)
    with pytest.raises(ConfigError, match="actors.autoscale.*min_workers=4 is above max_workers=3"):
        load_config(None, ["actors.autoscale.min_workers=4", "actors.autoscale.max_workers=3"])
    with pytest.raises(ConfigError, match="actors.autoscale.min_workers"):
        load_config(None, ["actors.autoscale.min_workers=0"])
