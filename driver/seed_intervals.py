"""Intervals with the training seed as the unit: Student t over the runs' own figures.

Why: in the learning study most of the variance between runs of one arm is the training seed
(which games the run trained on, how its sampling went), not the evaluation's. A run is one
draw of that; its held-out figure over the whole panel is one number, and an arm's seeds are a
sample of them. So each run counts once, and a small sample gets Student's t (a 95% t interval
over 2 seeds uses t = 12.71, over 3 seeds 4.30, over 8 seeds 2.36; never the normal 1.96).

- One arm: mean +- t(n-1) * sd / sqrt(n) over its runs.
- Two arms that ran the same training seeds: each seed's runs share their task stream (the same
  training games in the same order, the same base model and sampler seed), so the difference is
  taken per seed and the t interval is over those differences ("paired", n - 1 degrees of freedom):
  what a seed does to both arms cancels.
- Two arms with different seeds: Welch's unequal-variance t ("Welch"), with Welch-Satterthwaite
  degrees of freedom. Pairing on only the shared seeds would drop runs and report another mean.
- An arm against the base model, which has no training seed (its evaluations pooled into one figure):
  the arm's runs minus that figure, the base figure's own evaluation noise added to the variance
  (Welch-Satterthwaite degrees of freedom): each arm run's figure carries its evaluation noise in
  the runs' spread, the one base figure does not.

With one seed (in either arm, or one shared seed) there is no spread to estimate: no interval,
and the table says so. Two seeds that agree exactly give an interval of width 0, which is two
draws agreeing, not evidence of no seed variance; the table marks it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95


@dataclass(frozen=True)
class SeedInterval:
    """A figure (or a difference) over training seeds with its t interval, when it has one."""

    mean: float  # mean over seeds (for a difference: of the per-seed differences, or of the two arms' means)
    half_width: float | None  # t quantile x standard error; None with too few seeds for a spread
    seeds: int  # paired: the shared seeds; one arm: its seeds; Welch: the smaller arm's
    method: str  # "t" (one arm), "paired" (by seed), "Welch" (unpaired)
    df: float | None = None  # degrees of freedom of the t quantile

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided t quantile: t(0.975, 2) = 4.303, t(0.975, 7) = 2.365."""
    return float(stats.t.ppf(0.5 + level / 2, df))


def over_seeds(values: Sequence[float], level: float = LEVEL, method: str = "t") -> SeedInterval:
    """mean +- t(n-1) * sd / sqrt(n) over one value per seed; no interval for a single seed."""
    values = np.asarray(values, dtype=float)
    count = len(values)
    if count == 0:
        raise ValueError("over_seeds: no seeds")
    mean = float(values.mean())
    if count < 2:
        return SeedInterval(mean, None, count, method)
    standard_error = float(values.std(ddof=1)) / math.sqrt(count)
    return SeedInterval(mean, t_quantile(count - 1, level) * standard_error, count, method, float(count - 1))


def welch(first: Sequence[float], second: Sequence[float], level: float = LEVEL) -> SeedInterval:
    """mean(first) - mean(second) with Welch's t interval (each arm needs 2 seeds for its variance)."""
    first, second = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    mean = float(first.mean() - second.mean())
    smaller = min(len(first), len(second))
    if smaller < 2:
        return SeedInterval(mean, None, smaller, "Welch")
    first_term = first.var(ddof=1) / len(first)  # squared standard error of each arm's mean
    second_term = second.var(ddof=1) / len(second)
    variance = first_term + second_term
    if variance == 0:  # every run of both arms agrees: Satterthwaite's ratio is 0/0
        return SeedInterval(mean, 0.0, smaller, "Welch", float(len(first) + len(second) - 2))
    df = variance**2 / (first_term**2 / (len(first) - 1) + second_term**2 / (len(second) - 1))
    return SeedInterval(mean, t_quantile(df, level) * math.sqrt(variance), smaller, "Welch", float(df))


def seed_difference(first: Mapping[int, float], second: Mapping[int, float], level: float = LEVEL) -> SeedInterval:
    """first - second over training seeds (seed -> the run's figure): paired when both arms ran
    exactly the same seeds, Welch otherwise."""
    if set(first) == set(second):
        return over_seeds([first[seed] - second[seed] for seed in sorted(first)], level, method="paired")
    return welch(list(first.values()), list(second.values()), level)


def minus_estimate(
    values: Sequence[float], other: float, other_variance: float = 0.0, other_df: float = math.inf, level: float = LEVEL
) -> SeedInterval:
    """An arm's runs against one measured figure with no seed of its own (the pooled base model):
    mean(values) - other, its squared standard error var(values) / n + `other_variance` (the other's
    evaluation noise), with Welch-Satterthwaite degrees of freedom (`other_df` for the other's part).
    No interval with one run: the arm's spread over seeds is unknown."""
    differences = np.asarray(values, dtype=float) - other
    count = len(differences)
    mean = float(differences.mean())
    if count < 2:
        return SeedInterval(mean, None, count, "t")
    seed_term = differences.var(ddof=1) / count
    variance = seed_term + other_variance
    if other_variance == 0 or variance == 0:
        return over_seeds(differences, level)
    df = variance**2 / (seed_term**2 / (count - 1) + other_variance**2 / other_df)
    return SeedInterval(mean, t_quantile(df, level) * math.sqrt(variance), count, "t", float(df))
