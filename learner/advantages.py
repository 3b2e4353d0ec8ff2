"""Step-level credit assignment (GiGPO Eq. 3-8), as pure numpy over one row per env step.

A = A_episode + omega * A_step, where
- A_episode normalises each row's episode score within its task group (GRPO over G trajectories),
- A_step normalises each row's discounted return within its *anchor group*: the rows of the same
  task group whose agent stood at the same anchor observation (at any time step), so actions
  taken from the same state are compared with each other.

The semantics follow verl-agent's `gigpo/core_gigpo.py` (the reference numbers): unbiased std,
a task group with a single value has mean 0 and std 1, a singleton anchor group gets 0, and the
invalid-action penalty lands on the offending row only (its score and its return, never carried
back to earlier steps). Rows come in any order; the output is aligned with the input.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

MODES = ("mean_norm", "mean_std_norm")
EPISODE_STATS = ("per_step", "per_trajectory")


@dataclass
class AdvantageParts:
    """The two components of the SLEA/GiGPO advantage, per row, for metrics and checks."""

    episode: np.ndarray  # float64 [N]: group-normalised episode score of the row
    step: np.ndarray  # float64 [N]: anchor-group-normalised discounted return (0 for singletons)
    returns: np.ndarray  # float64 [N]: discounted return R_t of the row (invalid penalty included)
    anchor_group_size: np.ndarray  # int64 [N]: how many rows of the task group share this row's anchor


def _factorize(values: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Hashable values -> (int codes in first-seen order, number of distinct values)."""
    codes: dict[Hashable, int] = {}
    out = np.fromiter((codes.setdefault(value, len(codes)) for value in values), dtype=np.int64, count=len(values))
    return out, len(codes)


def _normalise(values: np.ndarray, codes: np.ndarray, count: int, with_std: bool, eps: float) -> np.ndarray:
    """(x - mean_g) or (x - mean_g) / (std_g + eps) with per-code unbiased statistics of `values`."""
    sizes = np.bincount(codes, minlength=count)
    means = np.bincount(codes, weights=values, minlength=count) / sizes
    centred = values - means[codes]
    if not with_std:
        return centred
    squares = np.bincount(codes, weights=centred**2, minlength=count)
    stds = np.sqrt(squares / np.maximum(sizes - 1, 1))
    return centred / (stds[codes] + eps)


def discounted_returns(
    episode_codes: np.ndarray, step_indices: np.ndarray, rewards: np.ndarray, gamma: float
) -> np.ndarray:
    """R_t = r_t + gamma * R_{t+1} within each episode, rows in any order (GiGPO Eq. 5)."""
    order = np.lexsort((step_indices, episode_codes))
    ordered_eps, ordered_steps = episode_codes[order], step_indices[order]
    repeated = (ordered_eps[1:] == ordered_eps[:-1]) & (ordered_steps[1:] == ordered_steps[:-1])
    if repeated.any():
        first = order[1:][repeated][0]
        raise ValueError(f"row {first} repeats a step index of its episode; deduplicate (episode_id, step) first")
    returns = np.empty(len(rewards), dtype=np.float64)
    running, previous_episode = 0.0, None
    for row in order[::-1]:
        if episode_codes[row] != previous_episode:
            running, previous_episode = 0.0, episode_codes[row]
        running = rewards[row] + gamma * running
        returns[row] = running
    return returns


def advantage_parts(
    group_ids: Sequence[Hashable],
    episode_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    anchors: Sequence[Hashable],
    rewards: Sequence[float],
    invalid: Sequence[bool] | None = None,
    *,
    gamma: float = 0.95,
    mode: str = "mean_norm",
    episode_stats: str = "per_step",
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> AdvantageParts:
    """Episode and step advantages separately; see `step_level_advantages` for the arguments."""
    if mode not in MODES:
        raise ValueError(f"mode '{mode}' is not one of {MODES}")
    if episode_stats not in EPISODE_STATS:
        raise ValueError(f"episode_stats '{episode_stats}' is not one of {EPISODE_STATS}")
    n = len(group_ids)
    columns = {"episode_ids": episode_ids, "step_indices": step_indices, "anchors": anchors, "rewards": rewards}
    if invalid is not None:
        columns["invalid"] = invalid
    for name, column in columns.items():
        if len(column) != n:
            raise ValueError(f"{name} has {len(column)} rows but group_ids has {n}")
    steps = np.asarray(step_indices, dtype=np.int64)
    reward = np.asarray(rewards, dtype=np.float64)
    penalty = invalid_penalty * (np.zeros(n) if invalid is None else np.asarray(invalid, dtype=np.float64))
    with_std = mode == "mean_std_norm"

    group_codes, group_count = _factorize(group_ids)
    # Episode ids are scoped by group so that a reused id in another group is another episode.
    episode_codes, episode_count = _factorize(list(zip(group_codes.tolist(), episode_ids)))

    totals = np.bincount(episode_codes, weights=reward, minlength=episode_count)
    scores = totals[episode_codes] - penalty  # GiGPO Eq. 3 input: episode return, row-penalised

    if episode_stats == "per_step":
        stat_values, stat_codes = scores, group_codes
    else:  # one value per trajectory: the score of its first step
        first_row = np.full(episode_count, -1)
        for row in np.lexsort((steps, episode_codes))[::-1]:
            first_row[episode_codes[row]] = row
        stat_values, stat_codes = scores[first_row], group_codes[first_row]
    sizes = np.bincount(stat_codes, minlength=group_count)
    means = np.bincount(stat_codes, weights=stat_values, minlength=group_count) / np.maximum(sizes, 1)
    means[sizes == 1] = 0.0  # the reference's convention for a group with one value: mean 0, std 1
    episode = scores - means[group_codes]
    if with_std:
        squares = np.bincount(stat_codes, weights=(stat_values - means[stat_codes]) ** 2, minlength=group_count)
        stds = np.where(sizes > 1, np.sqrt(squares / np.maximum(sizes - 1, 1)), 1.0)
        episode = episode / (stds[group_codes] + eps)

    returns = discounted_returns(episode_codes, steps, reward, gamma) - penalty
    anchor_codes, anchor_count = _factorize(list(zip(group_codes.tolist(), anchors)))
    anchor_sizes = np.bincount(anchor_codes, minlength=anchor_count)[anchor_codes]
    step = _normalise(returns, anchor_codes, anchor_count, with_std, eps)
    step[anchor_sizes == 1] = 0.0
    return AdvantageParts(episode=episode, step=step, returns=returns, anchor_group_size=anchor_sizes)


def step_level_advantages(
    group_ids,
    episode_ids,
    step_indices,
    anchors,
    rewards,
    invalid=None,
    *,
    gamma=0.95,
    omega=1.0,
    mode="mean_norm",
    episode_stats="per_step",
    invalid_penalty=0.1,
    eps=1e-6,
) -> np.ndarray:
    """SLEA-RL advantage per step row: A_episode + omega * A_step (float64 [N], input row order).

    group_ids: task group of each row (one task played G times); episode_ids: its trajectory;
    step_indices: position in the trajectory; anchors: the anchor state (raw observation or
    cluster key); rewards: the step's env reward; invalid: whether the row's action was invalid.
    mode: "mean_norm" (minus the group mean) or "mean_std_norm" (also divided by std + eps).
    episode_stats: statistics of the episode advantage over all step rows of the group
    ("per_step", what the reference code does) or one value per trajectory ("per_trajectory",
    what the paper writes). omega=0 is plain GRPO.
    """
    parts = advantage_parts(
        group_ids,
        episode_ids,
        step_indices,
        anchors,
        rewards,
        invalid,
        gamma=gamma,
        mode=mode,
        episode_stats=episode_stats,
        invalid_penalty=invalid_penalty,
        eps=eps,
    )
    return parts.episode + omega * parts.step
