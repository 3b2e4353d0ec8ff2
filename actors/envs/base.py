"""The multi-turn text environment interface every env adapter implements.

An env is cheap to construct and to reset, many live in one process, and a task is a small
serialisable value (`EnvTask`) so that a group of G trajectories plays exactly the same task
in G env instances, possibly on different workers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class EnvTask:
    """A reproducible task: the env rebuilds the same game from (env_name, seed, params) on any machine."""

    env_name: str  # registry name, e.g. "alfworld"
    task_id: str  # stable id, e.g. "alfworld/train/1234" or "alfworld/panel-default/7"
    task_type: str  # e.g. "pick_clean_then_place_in_recep"
    seed: int  # generator seed of this task
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)  # env-specific (difficulty...)


@dataclass
class EnvObservation:
    """What the agent sees after reset or a step (the raw pieces; prompt templates live in actors/prompts).

    The anchor is the *state* the agent is in, not the env's last reply. The learner groups the
    steps of a task group by it (GiGPO's anchor states) and the library clusters and retrieves by
    it, so two steps share an anchor exactly when the env considers them the same state. Each env
    says what its state is:

    - envs that render their state use the rendering: the board (frozenlake, sokoban), the page
      without the "Nothing happens." banner (webshop), the last search results or the question
      (search_qa);
    - envs whose engine answers with a transition message (alfworld, textworld) use the message of
      the last action that changed the state ("You arrive at fridge 1. The fridge 1 is closed.").

    A step that leaves the state as it was — an invalid action, or a valid one that only shows
    something (look, examine, inventory) — keeps the anchor of the state before it, so the
    constant replies of such steps ("Nothing happens.", "You are carrying nothing.") do not become
    anchors: they would put unrelated states into one anchor group and key retrieval on nothing.

    verl-agent's GiGPO (gigpo/core_gigpo.py `build_step_group`) groups by the exact anchor the env
    manager hands it, which for ALFWorld is the engine's raw reply after the step, invalid actions
    included (its projection sends them on and the engine answers "Nothing happens."). We match it
    in grouping by exact anchor within a task group and in using the engine's reply as the state
    text; we differ in keeping the previous state across invalid and observe-only actions, because
    those do not move the agent: grouping every post-invalid step of a task group under "Nothing
    happens." compares returns from unrelated states, which is the noise anchor grouping exists to
    remove.
    """

    text: str  # observation text shown to the agent for this state
    anchor_obs: str  # text of the state the agent is in, without template or history (the rule above)
    admissible_actions: list[str]  # actions the env accepts now ([] when any text is allowed)


@dataclass
class StepOutcome:
    """Result of env.step(action_text)."""

    observation: EnvObservation  # next state
    reward: float  # step reward (ALFWorld: 10 on success)
    done: bool  # episode ended (won, lost, or out of steps)
    won: bool  # task solved
    action_valid: bool  # the action parsed and was admissible; invalid steps change nothing
    info: dict[str, Any] = field(default_factory=dict)  # env extras (e.g. webshop reward parts, QA F1)


@dataclass
class ResetOutcome:
    """Result of env.reset(task)."""

    observation: EnvObservation  # initial state
    task_text: str  # the instruction, e.g. "Your task is to: put a clean mug in coffeemachine."
    task_type: str  # same as task.task_type


class TextEnv(ABC):
    """One adapter class per environment family; register it with @register_env("name")."""

    name: ClassVar[str] = ""
    default_max_steps: ClassVar[int] = 50

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        self.params = dict(params or {})
        self.max_steps = max_steps or self.default_max_steps

    @abstractmethod
    def task_types(self) -> list[str]:
        """The task types this env generates (for metrics and balanced sampling)."""

    @abstractmethod
    def make_task(self, seed: int, split: str) -> EnvTask:
        """Build the task of this seed; split is 'train' or 'panel-<name>' and is part of the task id."""

    @abstractmethod
    def reset(self, task: EnvTask) -> ResetOutcome:
        """Start an episode of `task`."""

    @abstractmethod
    def step(self, action: str | None) -> StepOutcome:
        """Apply one action (None or unparsable/inadmissible: invalid step, state and anchor unchanged, never raises)."""

    def expert_action(self) -> str | None:
        """The action of a planner/expert for the current state (None if the env has none)."""
        return None

    def close(self) -> None:  # noqa: B027 (a default no-op, not abstract: most need nothing)
        """Release engine resources."""

    def fingerprint(self, task: EnvTask) -> str:
        """Identity of the task's content; training never samples a task whose fingerprint is in a panel.

        Envs whose generator can produce the same game from two seeds override this with a hash
        of the generated content.
        """
        return f"{task.task_type}:{task.seed}"
