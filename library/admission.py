"""Admission and evolution rules as pure functions over plain data (tested with hand numbers).

A candidate first meets the items of its zone and task type: a near-duplicate (cosine >=
dedup threshold) absorbs it. Otherwise its level admits it while there is room; a full level
admits it only by replacing its minimum-score item, and only if the candidate scores higher.
Utility follows EDGE: an item's value is estimated only where the actors randomised, from the
A/B halves of a task group, and an item is pruned only when that estimate stays low (see
`utility_evidence` and `should_prune`).
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
    injected_ids: frozenset[str]  # experiences shown at any of its steps
    with_experience: bool  # StepRecord.with_experience: False only in the B half of an A/B group (shown nothing)


@dataclass
class Evidence:
    """What one window's episodes say about one item."""

    exposures: int  # episodes of the window it was shown in, in any group
    gain: float | None  # A/B gain (see utility_evidence); None when no A/B group showed it this window
    compared: int  # A-half episodes of A/B groups it was shown in: the sample `gain` averages over


def utility_evidence(episodes: list[EpisodeOutcome]) -> dict[str, Evidence]:
    """experience id -> Evidence, from one window's finished episodes.

    Gain comes only from groups with A/B halves (`actors.ab_groups`: some episodes with
    `with_experience` False): there the B half was shown nothing, by randomisation, so its
    success rate is the group's baseline, and the item's gain in the group is the success rate of
    the A-half episodes that were shown it minus that baseline. Gains of several groups are
    averaged, weighted by the A-half episodes that saw the item in each.

    Groups without a B half give exposures but no gain. Comparing episodes that were shown an
    item with episodes of the same group that were not (what this did before) confounds the item
    with the states that trigger it: with step-level retrieval a warning is shown only to episodes
    that reached its failure state, so it scored negative however much it helped, and the library
    pruned its own warnings.

    Matches EDGE in taking the B half as the baseline, as the issue (#12) states EDGE's rule;
    EDGE's own code could not be found to compare line by line. What it still measures is not a
    per-item causal effect: only the halves are randomised, not who within the A half is shown
    an item, so an item cued by failure states is still compared with a B half that includes
    episodes that never reached them. The alternative, crediting every item shown in the A half
    with the whole A-minus-B difference, is unbiased for the library as a whole but cannot tell
    one item from another; the residual bias is why pruning also needs a low utility that
    persists (`should_prune`).
    """
    by_group: dict[str, list[EpisodeOutcome]] = {}
    for episode in episodes:
        by_group.setdefault(episode.group_id, []).append(episode)
    exposures: dict[str, int] = {}
    weighted: dict[str, float] = {}
    compared: dict[str, int] = {}
    for group in by_group.values():
        for episode in group:
            for experience_id in episode.injected_ids:
                exposures[experience_id] = exposures.get(experience_id, 0) + 1
        a_half = [episode for episode in group if episode.with_experience]
        b_half = [episode.success for episode in group if not episode.with_experience]
        if not a_half or not b_half:
            continue
        baseline = sum(b_half) / len(b_half)
        for experience_id in set().union(*(episode.injected_ids for episode in a_half)):
            shown = [episode.success for episode in a_half if experience_id in episode.injected_ids]
            weighted[experience_id] = weighted.get(experience_id, 0.0) + (sum(shown) / len(shown) - baseline) * len(shown)
            compared[experience_id] = compared.get(experience_id, 0) + len(shown)
    return {
        experience_id: Evidence(count, weighted[experience_id] / compared[experience_id] if experience_id in compared else None,
                                compared.get(experience_id, 0))
        for experience_id, count in exposures.items()
    }


def low_windows_after(utility: float, low_windows: int, at_or_below: float) -> int:
    """Consecutive windows, among those that gave the item A/B evidence, whose utility ended at or
    below the threshold: one more if this window's did, back to 0 if it rose above. Windows
    without evidence are not counted at all (the caller skips them): they say nothing new, and
    counting them would prune an item on one window's evidence seen twice."""
    return low_windows + 1 if utility <= at_or_below else 0


def should_prune(low_windows: int, compared: int, windows: int, min_exposures: int) -> bool:
    """EDGE's rule: utility at or below the threshold (-0.25) over at least `windows` (2)
    consecutive windows. Two additions of ours: the utility compared is the exponential average
    of the window gains (`library.utility_rate`; 1.0 compares each window's own gain, as the
    rule reads literally), and at least `min_exposures` A-half episodes must stand behind it, so
    a rarely shown item is not removed on a few coin flips (two windows of one failed A-half
    episode each would otherwise suffice)."""
    return low_windows >= windows and compared >= min_exposures
