"""The `rules` extractor: deterministic lessons from the action sequence, for offline and cheap runs.

A success yields its plan (every action, indexed to every state it passed through) and its
finishing move. A failure yields up to three warnings: the first invalid action (with the
action a successful episode of the same group took in the same state, if there is one), the
most repeated action, and the last actions before the episode ran out.
"""

from __future__ import annotations

from collections import Counter

from library.cluster_key import structural_key
from library.episodes import Episode, episode_score, failure_severity
from library.experience import STRATEGY, WARNING, Candidate

_CUE_CHARS = 160  # a cue quotes the start of the observation it applies to


def _cue(observation: str) -> str:
    text = " ".join(observation.split())
    return text if len(text) <= _CUE_CHARS else text[: _CUE_CHARS - 3] + "..."


class RulesExtractor:
    """Same input, same lessons; no model."""

    name = "rules"

    def distil_success(self, episode: Episode, existing: list[str]) -> list[Candidate]:
        actions = [step.action for step in episode.steps if step.action]
        if not actions:
            return []
        score = episode_score(episode)
        first, last = episode.steps[0], episode.steps[-1]
        plan = Candidate(
            STRATEGY,
            "method",
            f"A plan that solved this {episode.task_type} task: " + "; ".join(actions) + ".",
            _cue(first.anchor_obs),
            episode.task_type,
            [step.anchor_obs for step in episode.steps],
            score,
            [episode.episode_id],
        )
        finish = Candidate(
            STRATEGY,
            "example",
            f"In this state, '{last.action}' completed the task.",
            _cue(last.anchor_obs),
            episode.task_type,
            [last.anchor_obs],
            score,
            [episode.episode_id],
        )
        return [plan, finish] if last.action else [plan]

    def distil_failure(self, episode: Episode, reference: Episode | None) -> list[Candidate]:
        score = failure_severity(episode)
        warnings: list[Candidate] = []

        def warn(level: str, content: str, steps: list, avoid: str) -> None:
            warnings.append(
                Candidate(
                    WARNING,
                    level,
                    content,
                    _cue(steps[0].anchor_obs),
                    episode.task_type,
                    [step.anchor_obs for step in steps],
                    score,
                    [episode.episode_id],
                    avoid,
                    _reference_action(reference, steps[0].anchor_obs),
                )
            )

        invalid = [step for step in episode.steps if not step.action_valid]
        if invalid:
            warn(
                "mistake",
                f"'{invalid[0].action}' was not a valid action in this state.",
                [invalid[0]],
                invalid[0].action,
            )
        repeats = Counter(step.action for step in episode.steps if step.action)
        if repeats:
            action, count = repeats.most_common(1)[0]
            if count >= 2:
                steps = [step for step in episode.steps if step.action == action]
                warn("pattern", f"Repeating '{action}' ({count} times) made no progress.", steps, action)
        tail = episode.steps[-3:]
        taken = "; ".join(step.action or "<no action>" for step in tail)
        budget = episode.steps[-1].step_budget or len(episode.steps)
        warn(
            "diagnostic",
            f"The episode failed after: {taken} (used {len(episode.steps)}/{budget} steps).",
            tail,
            tail[-1].action,
        )
        return warnings[:3]


def _reference_action(reference: Episode | None, observation: str) -> str:
    """What a successful episode of the same group did in the same state ('' if it never was there)."""
    if reference is None:
        return ""
    key = structural_key(observation)
    for step in reference.steps:
        if structural_key(step.anchor_obs) == key:
            return step.action
    return ""
