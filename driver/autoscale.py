"""When the actor pool should grow or shrink: pure functions over one interval's signals.

Two signals, each the symptom of one mismatch between actors and learner:

- the learner waits for groups (its `wait_seconds` are a large share of its time): actors
  produce too slowly, so grow;
- the actors are held back by their gate (the learner would train a new group more than
  `actors.max_staleness` versions later, their weights are that far behind the learner's, or the
  learner's stream lag is over `redis.max_lag`): the pool plays faster than the learner trains,
  and more workers would only wait, so shrink.

They rarely hold together: while actors are throttled, ready groups pile up and the learner
does not wait. Shrinking is checked first all the same: playing past the bound is wasted work.
No growth while workers of an earlier decision are still starting (a node being added, a model
loading): the interval they missed says nothing yet about the size they make. The driver
(driver/pool_control.py) collects the signals and applies the decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from slea.config import AutoscaleConfig


@dataclass(frozen=True)
class PoolSignals:
    """What one decision looks at: the interval since the previous decision."""

    desired: int  # workers the pool is asked to have now
    alive: int  # of those, workers placed, started and answering
    learner_steps: int  # learner steps finished in the interval
    learner_wait_s: float  # their `wait_seconds` summed: time the learner waited for ready groups
    learner_train_s: float  # their `step_seconds` summed: time the learner trained
    throttled_fraction: float  # share of the workers' time held back by the gate (throttled_fraction())


@dataclass(frozen=True)
class Decision:
    """A pool size and why."""

    kind: str  # "grow" | "shrink" | "hold"
    workers: int  # the desired size after the decision
    reason: str  # one line for the driver's log


def throttled_fraction(before: dict[int, float], after: dict[int, float], seconds: float) -> float:
    """Share of the interval the workers spent held back, from their cumulative `throttled_s` at its
    start and end (worker index -> seconds). Only workers present at both ends count, and a worker
    whose count went down restarted in between (its count began again): its interval is unknown."""
    deltas = [after[index] - before[index] for index in after if index in before and after[index] >= before[index]]
    if not deltas or seconds <= 0:
        return 0.0
    return min(sum(deltas) / (len(deltas) * seconds), 1.0)


def decide(signals: PoolSignals, policy: AutoscaleConfig) -> Decision:
    """The pool size for the next interval."""
    lo, hi = policy.min_workers, policy.max_workers
    if signals.desired < lo:
        return Decision("grow", lo, f"below actors.autoscale.min_workers={lo}")
    if signals.desired > hi:
        return Decision("shrink", hi, f"above actors.autoscale.max_workers={hi}")
    if signals.throttled_fraction > policy.shrink_throttled_fraction and signals.desired > lo:
        return Decision(
            "shrink",
            max(signals.desired - policy.step, lo),
            f"actors held back {signals.throttled_fraction:.0%} of the time by the staleness/lag bound",
        )
    if signals.alive < signals.desired:
        return Decision("hold", signals.desired, f"{signals.desired - signals.alive} worker(s) still starting")
    busy = signals.learner_wait_s + signals.learner_train_s
    if signals.learner_steps == 0 or busy <= 0:
        return Decision("hold", signals.desired, "no learner step in the interval")
    waiting = signals.learner_wait_s / busy
    if waiting > policy.grow_wait_fraction and signals.desired < hi:
        return Decision(
            "grow", min(signals.desired + policy.step, hi), f"learner waited {waiting:.0%} of its time for groups"
        )
    return Decision(
        "hold", signals.desired, f"learner waited {waiting:.0%}, actors held back {signals.throttled_fraction:.0%}"
    )
