"""Admission and evolution rules as pure functions over plain data (tested with hand numbers).

A candidate first meets the items of its zone and task type: a near-duplicate (cosine >=
dedup threshold) absorbs it. Otherwise its level admits it while there is room; a full level
admits it only by replacing its minimum-score item, and only if the candidate scores higher.
Utility follows EDGE: an item's value is how much more often episodes that saw it succeeded
than comparable episodes (same task group) that did not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ADMIT = "admit"  # room in the level
REPLACE = "replace"  # level full, candidate beats its minimum, which is evicted
MERGE = "merge"  # near-duplicate of an existing item of the zone
REJECT = "reject"  # level full and candidate does not beat its minimum


@dataclass
class Decision:
    """What admission does with one candidate."""

    action: str  # ADMIT | REPLACE | MERGE | REJECT
    target_id: str | None = None  # MERGE: the item absorbing it; REPLACE: the item evicted
    similarity: float = 0.0  # MERGE: cosine with the target


def decide(
    candidate_embedding: np.ndarray,
    candidate_score: float,
    zone_ids: list[str],
    zone_embeddings: np.ndarray,
    level_scores: dict[str, float],
    capacity: int,
    dedup_threshold: float,
) -> Decision:
    """Fate of one candidate.

    zone_ids / zone_embeddings: items of the candidate's zone and task type ([n], [n, dim]);
    level_scores: id -> score of the items in the candidate's level (all task types share it).
    """
    if len(zone_ids):
        similarities = zone_embeddings @ candidate_embedding
        best = int(np.argmax(similarities))
        if similarities[best] >= dedup_threshold:
            return Decision(MERGE, zone_ids[best], float(similarities[best]))
    if len(level_scores) < capacity:
        return Decision(ADMIT)
    if capacity == 0:
        return Decision(REJECT)
    weakest = min(level_scores, key=level_scores.__getitem__)
    if candidate_score > level_scores[weakest]:
        return Decision(REPLACE, weakest)
    return Decision(REJECT, weakest)


def exponential_average(old: float, observation: float, rate: float) -> float:
    return (1.0 - rate) * old + rate * observation


@dataclass
class EpisodeOutcome:
    """The part of a finished episode that utility needs."""

    group_id: str  # task group: the comparable episodes
    success: bool  # episode outcome
    injected_ids: frozenset[str]  # experiences injected at any of its steps


def utility_evidence(episodes: list[EpisodeOutcome]) -> dict[str, tuple[float | None, int]]:
    """experience id -> (success rate with it - success rate without it, episodes with it);
    the difference is None when no episode of its groups went without it.

    Compared within each task group only (same task, same policy era): a group where every
    episode saw the item, or none did, gives exposures but no difference. Differences of
    several groups are averaged, weighted by the item's exposures in each.
    """
    by_group: dict[str, list[EpisodeOutcome]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group_id, []).append(episode)
    weighted: dict[str, float] = {}
    compared: dict[str, int] = {}
    exposures: dict[str, int] = {}
    for group in by_group.values():
        for experience_id in set().union(*(episode.injected_ids for episode in group)):
            with_it = [episode.success for episode in group if experience_id in episode.injected_ids]
            without = [episode.success for episode in group if experience_id not in episode.injected_ids]
            exposures[experience_id] = exposures.get(experience_id, 0) + len(with_it)
            if without:
                difference = sum(with_it) / len(with_it) - sum(without) / len(without)
                weighted[experience_id] = weighted.get(experience_id, 0.0) + difference * len(with_it)
                compared[experience_id] = compared.get(experience_id, 0) + len(with_it)
    return {
        experience_id: (weighted[experience_id] / compared[experience_id] if experience_id in compared else None, count)
        for experience_id, count in exposures.items()
    }


def should_prune(utility: float, exposures: int, min_exposures: int, utility_below: float) -> bool:
    """Enough exposures that the average means something, and it says the item hurts."""
    return exposures >= min_exposures and utility < utility_below
