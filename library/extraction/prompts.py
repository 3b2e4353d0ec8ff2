"""Prompts B and C: the only text the llm extractor sends to a model (documented in the README).

Both show the whole trajectory, every step's observation and action, because a lesson is about
the state it applies to, and the decisive state is rarely the first. Each asks for a bare JSON
array whose items name the step whose state the lesson applies to; `library.extraction.parse`
rejects anything else.
"""

from __future__ import annotations

from library.episodes import Episode

OBSERVATION_CHARS = 400  # per step; a 50-step ALFWorld episode stays within a small model's context

PROMPT_B = """You study an agent that solved a task in a text environment and write lessons for future attempts.
Task type: {task_type}
Trajectory:
{trajectory}
Outcome: success after {steps} steps.
Lessons the library already holds for these states:
{existing}
Write at most 3 new lessons that would help in the same states. Answer with a JSON array only, no other text. Each item:
{{"level": "principle" or "method" or "example", "content": "<the lesson in one sentence>", "cue": "<the state it applies to>", "step": <number of the step whose state it applies to>}}"""

PROMPT_C = """You study an agent that failed a task in a text environment and write warnings for future attempts.
Task type: {task_type}
Failed trajectory:
{trajectory}
Outcome: failure after {steps} steps.
{reference}
Write at most 3 warnings. Answer with a JSON array only, no other text. Each item:
{{"level": "mistake" or "pattern" or "diagnostic", "content": "<what went wrong, one sentence>", "trigger": "<the state where it happens>", "step": <number of the step where it happens>, "avoid": "<the action to avoid>", "instead": "<the action to take instead>"}}"""


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= OBSERVATION_CHARS else text[: OBSERVATION_CHARS - 3] + "..."


def format_trajectory(episode: Episode) -> str:
    return "\n".join(
        f"Step {step.step}. Observation: {_clip(step.anchor_obs)}\n   Action: {step.action or '<none>'}"
        + ("" if step.action_valid else " (invalid)")
        for step in episode.steps
    )


def prompt_b(episode: Episode, existing: list[str]) -> str:
    """Prompt B: lessons from a success, given the strategies already indexed to its states."""
    return PROMPT_B.format(
        task_type=episode.task_type,
        trajectory=format_trajectory(episode),
        steps=len(episode.steps),
        existing="\n".join(f"- {text}" for text in existing) or "- (none yet)",
    )


def prompt_c(episode: Episode, reference: Episode | None) -> str:
    """Prompt C: warnings from a failure, with a success of the same group to contrast if there is one."""
    contrast = (
        "A successful trajectory of the same task, for contrast:\n" + format_trajectory(reference)
        if reference is not None
        else "No successful trajectory of this task is available."
    )
    return PROMPT_C.format(
        task_type=episode.task_type, trajectory=format_trajectory(episode), steps=len(episode.steps), reference=contrast
    )
