"""Scripted episodes, candidates and configs shared by the library tests."""

from __future__ import annotations

from library.episodes import Episode
from library.experience import LEVELS, STRATEGY, WARNING, Candidate
from slea.config import LibraryConfig
from slea.records import StepRecord


def library_config(**overrides) -> LibraryConfig:
    """Small capacities and no warm-up, so a test sees every rule with a handful of items."""
    values = {
        "warmup_versions": 0,
        "warmup_experiences": 0,
        "strategy_capacity": dict.fromkeys(LEVELS[STRATEGY], 2),
        "warning_capacity": dict.fromkeys(LEVELS[WARNING], 2),
    }
    return LibraryConfig(**{**values, **overrides})


def steps_of(
    episode_id: str,
    observations: list[str],
    actions: list[str],
    *,
    success: bool,
    task_type: str = "pick",
    group_id: str = "g0",
    policy_version: int = 0,
    valid: list[bool] | None = None,
    experience_ids: list[list[str]] | None = None,
    budget: int = 10,
    run_id: str = "test",
    with_experience: bool = True,
    clusters: list[str] | None = None,
) -> list[StepRecord]:
    """The StepRecords an actor would send for one scripted episode (`with_experience` False: the
    B half of an A/B group; `clusters`: the anchor cluster retrieval found at each step, "" for none)."""
    last = len(observations) - 1
    return [
        StepRecord(
            run_id=run_id,
            task_id=f"task-{group_id}",
            task_type=task_type,
            env_name="alfworld",
            group_id=group_id,
            episode_id=episode_id,
            step=index,
            anchor_obs=observation,
            action=action,
            action_valid=True if valid is None else valid[index],
            reward=1.0 if (success and index == last) else 0.0,
            done=index == last,
            success=success and index == last,
            policy_version=policy_version,
            experience_ids=[] if experience_ids is None else experience_ids[index],
            step_budget=budget,
            with_experience=with_experience,
            anchor_cluster="" if clusters is None else clusters[index],
        )
        for index, (observation, action) in enumerate(zip(observations, actions))
    ]


def episode_of(episode_id: str, observations: list[str], actions: list[str], **options) -> Episode:
    steps = steps_of(episode_id, observations, actions, **options)
    first = steps[0]
    return Episode(
        episode_id, first.task_id, first.task_type, first.group_id, steps, [f"{i}-0" for i in range(len(steps))]
    )


def candidate(
    content: str,
    score: float,
    *,
    zone: str = STRATEGY,
    level: str = "method",
    observation: str = "You are in the kitchen.",
    task_type: str = "pick",
    cue: str = "",
) -> Candidate:
    return Candidate(zone, level, content, cue, task_type, [observation], score, ["ep"])
