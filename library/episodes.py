"""From step records to finished episodes, and which episodes a window distils.

The stream delivers steps of many episodes interleaved and possibly twice (at-least-once);
`EpisodeBuffer` keys them by (episode id, step) and hands an episode over once its `done`
step and every step before it have arrived. Abandoned episodes (the actor died) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from library.admission import EpisodeOutcome
from slea.records import StepRecord


@dataclass
class Episode:
    """One finished trajectory, steps in order."""

    episode_id: str  # StepRecord.episode_id
    task_id: str  # the task played
    task_type: str  # library partition
    group_id: str  # the G trajectories of one task
    steps: list[StepRecord]  # step 0..n-1, each once
    entry_ids: list[str]  # stream entries that carried the steps (acked when their effect is durable)

    @property
    def success(self) -> bool:
        return self.steps[-1].success

    @property
    def total_reward(self) -> float:
        return sum(step.reward for step in self.steps)

    @property
    def policy_version(self) -> int:
        return max(step.policy_version for step in self.steps)

    @property
    def with_experience(self) -> bool:
        """False in the B half of an A/B group (the actor showed it nothing, by design)."""
        return self.steps[0].with_experience

    def injected_ids(self) -> frozenset[str]:
        return frozenset(experience_id for step in self.steps for experience_id in step.experience_ids)

    def outcome(self) -> EpisodeOutcome:
        """What utility needs of it: outcome, half, the clusters its steps reached and, per item
        shown, the clusters it was shown at. A step with anchor_cluster "" (no retrieval, warm-up,
        an observation no cluster holds) adds no cluster: `utility_evidence` cannot match it."""
        shown_in: dict[str, set[str]] = {}
        for step in self.steps:
            if step.anchor_cluster:
                for experience_id in step.experience_ids:
                    shown_in.setdefault(experience_id, set()).add(step.anchor_cluster)
        return EpisodeOutcome(
            group_id=self.group_id,
            success=self.success,
            injected_ids=self.injected_ids(),
            with_experience=self.with_experience,
            visited_clusters=frozenset(step.anchor_cluster for step in self.steps if step.anchor_cluster),
            shown_in={experience_id: frozenset(clusters) for experience_id, clusters in shown_in.items()},
        )


def episode_score(episode: Episode) -> float:
    """How good an episode was: reward, a bonus of 1 for success, and a penalty of up to 0.5
    for using its step budget, so the shortest of several successes ranks first."""
    budget = episode.steps[-1].step_budget or len(episode.steps)
    return episode.total_reward + (1.0 if episode.success else 0.0) - 0.5 * len(episode.steps) / max(budget, 1)


def select_for_extraction(
    episodes: list[Episode], max_successes: int, max_failures: int
) -> tuple[list[Episode], list[Episode]]:
    """The best `max_successes` successes and the worst `max_failures` failures (rate limit)."""
    successes = sorted((e for e in episodes if e.success), key=episode_score, reverse=True)
    failures = sorted((e for e in episodes if not e.success), key=episode_score)
    return successes[:max_successes], failures[:max_failures]


class EpisodeBuffer:
    """Collects steps until their episode is complete."""

    def __init__(self) -> None:
        self._steps: dict[str, dict[int, StepRecord]] = {}
        self._entries: dict[str, list[str]] = {}
        self._done_at: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, entry_id: str, record: StepRecord) -> Episode | None:
        """Add one delivered step; returns its episode when this step completed it."""
        steps = self._steps.setdefault(record.episode_id, {})
        self._entries.setdefault(record.episode_id, []).append(entry_id)
        steps.setdefault(record.step, record)  # a redelivered step is the same step
        if record.done:
            self._done_at[record.episode_id] = record.step
        last = self._done_at.get(record.episode_id)
        if last is None or len(steps) < last + 1 or any(index not in steps for index in range(last + 1)):
            return None
        del self._steps[record.episode_id], self._done_at[record.episode_id]
        ordered = [steps[index] for index in range(last + 1)]
        first = ordered[0]
        return Episode(
            record.episode_id,
            first.task_id,
            first.task_type,
            first.group_id,
            ordered,
            self._entries.pop(record.episode_id),
        )

    def drop(self, episode_id: str) -> list[str]:
        """Forget an episode (abandoned); returns the entry ids of its steps so far."""
        self._steps.pop(episode_id, None)
        self._done_at.pop(episode_id, None)
        return self._entries.pop(episode_id, [])


def failure_severity(episode: Episode) -> float:
    """Admission score of a warning: the share of the step budget the failure burnt (times 0.5,
    as in episode_score) plus the share of its actions that were invalid."""
    budget = episode.steps[-1].step_budget or len(episode.steps)
    invalid = sum(not step.action_valid for step in episode.steps) / len(episode.steps)
    return 0.5 * len(episode.steps) / max(budget, 1) + invalid
