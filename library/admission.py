"""Admission and evolution rules as pure functions over plain data (tested with hand numbers).

A candidate first meets the items of its zone and task type: a near-duplicate (cosine >=
dedup threshold) absorbs it. Otherwise its level admits it while there is room; a full level
admits it only by replacing its minimum-score item, and only if the candidate scores higher.
Utility follows EDGE: an item's value is estimated only where the actors randomised, from the
A/B halves of a task group, both taken at the states where the item is shown, and an item is
pruned only when that estimate stays low (see `utility_evidence` and `should_prune`).
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
    """The part of a finished episode that utility needs (built by `library.episodes.Episode.outcome`)."""

    group_id: str  # task group: the comparable episodes
    success: bool  # episode outcome
    injected_ids: frozenset[str]  # experiences shown at any of its steps, with or without a cluster (exposures)
    with_experience: bool  # StepRecord.with_experience: False only in the B half of an A/B group (shown nothing)
    visited_clusters: frozenset[str]  # StepRecord.anchor_cluster of every step that has one: the states it
    # reached, keyed as retrieval keys them; both halves record it (the B half retrieves without showing)
    shown_in: dict[str, frozenset[str]]  # experience id -> anchor clusters of the steps it was shown at; only
    # steps with a cluster count (a warm-up or missed step cannot be matched), so an item shown only there is absent


@dataclass
class Evidence:
    """What one window's episodes say about one item."""

    exposures: int  # episodes of the window it was shown in, in any group
    gain: float | None  # A/B gain (see utility_evidence); None when no A/B group gave a matched comparison this window
    compared: int  # treated A-half episodes of the groups that gave a gain: the sample `gain` averages over


def utility_evidence(episodes: list[EpisodeOutcome]) -> dict[str, Evidence]:
    """experience id -> Evidence, from one window's finished episodes.

    Gain comes only from groups with A/B halves (`actors.ab_groups`: some episodes with
    `with_experience` False), and within a group it compares like with like. An item X is shown
    only in the states it is retrieved for, so the episodes shown it are not a random part of
    the A half: a warning reaches only the episodes that walked into its failure state. What
    the actors randomised is the half; so the comparison conditions both halves on the same
    event, reaching a state where X is shown, keyed by the library cluster of the step's
    observation (`StepRecord.anchor_cluster`, recorded by both halves):

    - C(X): the clusters of the A-half steps at which X was shown (`shown_in`);
    - treated: the A-half episodes shown X at such a step;
    - controls: the B-half episodes that visited any cluster of C(X), at any step: those that
      would have been shown X had they been in the A half;
    - gain in the group: success rate of the treated - success rate of the controls.

    A group where no B episode visited C(X) gives exposures but no gain; so does a group
    without a B half. Gains of several groups are averaged, weighted by the treated episodes
    of each. Steps without a cluster (before the library's warm-up, or an observation no cluster
    holds; fallback items can still be shown there) cannot be matched to a B step and are left
    out: an A episode shown X only there is an exposure, not a treated episode. Under
    `actors.retrieval_mode: task` only step 0 retrieves and has a cluster, so items are matched
    on the first state, the one they were chosen for.

    Deviation from EDGE's rule as the issue (#12) states it (A-half episodes shown X against the
    whole B half; EDGE's own code could not be found): against the whole B half a warning that
    changes nothing scores the failure rate of its state minus the group's, below zero, and one
    cued by an often fatal state was pruned. Conditioning both halves on reaching C(X) keeps the
    comparison randomised: an episode reaches C(X) for the first time before X is first shown
    (unless X was also shown earlier at a step without a cluster), so X cannot select who is in
    either arm, and the halves were drawn at random. The arms differ by X and by whatever else
    the A half was shown before reaching C(X) (the other items' effect on which episodes get
    there), not by X's trigger. Two limits remain: the library may change version within a
    window, so an A episode that reached C(X) before X was admitted is neither treated nor a
    control while a B episode there counts as a control; and C(X) is pooled over the group's
    A-half episodes.
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
        b_half = [episode for episode in group if not episode.with_experience]
        if not a_half or not b_half:
            continue
        for experience_id in set().union(*(episode.shown_in for episode in a_half)):
            treated = [episode for episode in a_half if experience_id in episode.shown_in]
            shown_at = frozenset().union(*(episode.shown_in[experience_id] for episode in treated))
            controls = [episode.success for episode in b_half if episode.visited_clusters & shown_at]
            if not controls:
                continue
            gain = sum(episode.success for episode in treated) / len(treated) - sum(controls) / len(controls)
            weighted[experience_id] = weighted.get(experience_id, 0.0) + gain * len(treated)
            compared[experience_id] = compared.get(experience_id, 0) + len(treated)
    return {
        experience_id: Evidence(
            count,
            weighted[experience_id] / compared[experience_id] if experience_id in compared else None,
            compared.get(experience_id, 0),
        )
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
    rule reads literally), and at least `min_exposures` compared A-half episodes (the treated of
    `utility_evidence`, summed over windows) must stand behind it, so a rarely shown item is not
    removed on a few coin flips (two windows of one failed A-half episode each would otherwise
    suffice)."""
    return low_windows >= windows and compared >= min_exposures
