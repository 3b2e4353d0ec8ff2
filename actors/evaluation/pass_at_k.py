"""Pass@(k,T): the chance that at least one of k independent episodes succeeds within T steps.

From n >= k episodes of a task, c of which succeeded within T steps, the unbiased estimator is
1 - C(n-c, k) / C(n, k) (Chen et al. 2021). The binomials overflow float64 for modest n, so it
is computed in the product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), whose factors all lie in
[0, 1]. Pure functions over arrays: one call estimates every task of a panel.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def pass_at_k(n: ArrayLike, c: ArrayLike, k: int) -> np.ndarray:
    """Per-task Pass@k from `n` samples with `c` successes (arrays broadcast; one value per task)."""
    n_arr, c_arr = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if np.any(c_arr < 0) or np.any(c_arr > n_arr):
        raise ValueError(f"successes must lie in [0, n]; got c={c_arr.tolist()} for n={n_arr.tolist()}")
    if np.any(n_arr < k):
        raise ValueError(f"Pass@{k} needs at least {k} samples per task; smallest n is {int(n_arr.min())}")
    if n_arr.size == 0:
        return np.zeros(n_arr.shape)
    # Row t multiplies (1 - k/i) over i in (n_t - c_t, n_t]; other columns contribute 1.
    i = np.arange(1, int(n_arr.max()) + 1, dtype=np.float64)
    in_range = (i > (n_arr - c_arr)[..., None]) & (i <= n_arr[..., None])
    factors = np.where(in_range, 1.0 - k / i, 1.0)
    # A factor i == k is exactly 0 (n - c < k: every k-subset holds a success) so the product is 0.
    return 1.0 - np.clip(factors, 0.0, 1.0).prod(axis=-1)


def steps_to_success_grid(steps_to_success: np.ndarray, budgets: list[int]) -> np.ndarray:
    """Successes within each budget: [tasks, n] steps of the winning step (NaN = failed) -> [len(T), tasks]."""
    steps = np.asarray(steps_to_success, dtype=np.float64)
    # NaN <= T is False, so failures never count.
    return np.stack([(steps <= budget).sum(axis=-1) for budget in budgets])


def pass_at_k_t_grid(steps_to_success: np.ndarray, ks: list[int], budgets: list[int]) -> np.ndarray:
    """Mean over tasks of Pass@(k,T): [len(ks), len(budgets)] from [tasks, n] steps-to-success (NaN = failed)."""
    steps = np.asarray(steps_to_success, dtype=np.float64)
    if steps.ndim != 2 or steps.shape[0] == 0:
        raise ValueError(f"need steps-to-success as [tasks, samples] with at least one task, got shape {steps.shape}")
    n = steps.shape[1]
    successes = steps_to_success_grid(steps, budgets)
    grid = np.empty((len(ks), len(budgets)))
    for row, k in enumerate(ks):
        for col in range(len(budgets)):
            grid[row, col] = pass_at_k(n, successes[col], k).mean()
    return grid
