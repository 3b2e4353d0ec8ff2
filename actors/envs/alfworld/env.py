"""The `alfworld` env: ALFWorld's household tasks on ALFWorld's own text engine.

Games are generated (see `generator`) unless the official ALFWorld games are present
(ALFWORLD_DATA, see `official`). Params (the run config's `params` for this env):

- `difficulty`: "easy" | "medium" | "full" (default: "full", rooms as large as ALFWorld's);
  `max_receptacles`, `distractors`, `max_target_copies` override single knobs of it.
- `task_types`: the task types to generate (default: all six).
- `source`: "auto" (official games when ALFWORLD_DATA holds them, else generated),
  "generated" or "official". Official games are played as they are (no difficulty knob);
  training draws from ALFWorld's train split, panels from valid_unseen (or valid_seen for a
  panel named so).

Reward is 10 on the step that solves the task (as verl-agent), 0 otherwise.

The anchor observation (see `EnvObservation`) is the feedback of the last command that changed
the state: the room at reset, then e.g. "You arrive at fridge 1. The fridge 1 is closed.". An
invalid command ("Nothing happens.") and a command that only shows something (look, examine,
inventory, help: their answers "You are not carrying anything." or the help text are the same in
many states) keep the anchor of the state they were issued in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from actors.envs.alfworld import catalog, official
from actors.envs.alfworld.engine import AlfredEngine, EngineState
from actors.envs.alfworld.generator import DIFFICULTIES, Difficulty, generate_game
from actors.envs.alfworld.verification import cached_walkthrough, verified_walkthrough
from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv
from actors.envs.registry import register_env

SUCCESS_REWARD = 10.0
NOTHING_HAPPENS = "Nothing happens."  # the engine's own answer to a command it does not know
# Commands whose only effect is a (checked ?x) fact, which no precondition or goal reads: they
# leave a plan from the current state valid.
_OBSERVING_VERBS = ("look", "examine", "inventory", "help")
SOURCES = ("auto", "generated", "official")


@dataclass(frozen=True)
class AlfworldSettings:
    """The env's params, validated."""

    difficulty: Difficulty  # room size of generated games
    task_types: tuple[str, ...]  # task types make_task draws from
    source: str  # "auto", "generated" or "official"

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> AlfworldSettings:
        unknown = set(params) - {"difficulty", "task_types", "source", *Difficulty.__dataclass_fields__}
        if unknown:
            raise ValueError(f"alfworld: unknown params {sorted(unknown)}")
        level = params.get("difficulty", "full")
        if level not in DIFFICULTIES:
            raise ValueError(f"alfworld: difficulty must be one of {list(DIFFICULTIES)}, got {level!r}")
        knobs = asdict(DIFFICULTIES[level])
        knobs.update({k: params[k] for k in Difficulty.__dataclass_fields__ if k in params})
        task_types = tuple(params.get("task_types") or catalog.TASK_TYPES)
        unknown_types = set(task_types) - set(catalog.TASK_TYPES)
        if unknown_types:
            raise ValueError(f"alfworld: unknown task types {sorted(unknown_types)}; known: {list(catalog.TASK_TYPES)}")
        source = params.get("source", "auto")
        if source not in SOURCES:
            raise ValueError(f"alfworld: source must be one of {list(SOURCES)}, got {source!r}")
        return cls(Difficulty(**knobs), task_types, source)


@register_env("alfworld")
class AlfworldEnv(TextEnv):
    """ALFWorld (text) with generated or official games; one engine per env instance, created on first reset."""

    default_max_steps = 50

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        super().__init__(params, max_steps)
        self.settings = AlfworldSettings.from_params(self.params)
        self._official_root = self._resolve_official_root()
        self._engine: AlfredEngine | None = None
        self._state: EngineState | None = None
        self._steps = 0
        self._done = False
        self._plan: list[str] | None = None  # planner commands from the current state, None: ask the planner
        self._anchor = ""  # text of the current state: the feedback of the last command that changed it

    def _resolve_official_root(self) -> Path | None:
        if self.settings.source == "generated":
            return None
        root = official.official_data_root()
        if root is None and self.settings.source == "official":
            raise official.OfficialDataError("alfworld: source 'official' needs ALFWORLD_DATA pointing to the games")
        return root

    def task_types(self) -> list[str]:
        return list(self.settings.task_types)

    def make_task(self, seed: int, split: str) -> EnvTask:
        if self._official_root is not None:
            games = official.game_files(self._official_root, official.split_for(split), self.settings.task_types)
            game_file = games[seed % len(games)]
            return EnvTask(
                "alfworld",
                f"alfworld/{split}/{seed}",
                official.task_type_of(game_file),
                seed,
                params={"game_file": game_file},
            )
        task_type = self.settings.task_types[seed % len(self.settings.task_types)]
        return EnvTask("alfworld", f"alfworld/{split}/{seed}", task_type, seed, params=asdict(self.settings.difficulty))

    def fingerprint(self, task: EnvTask) -> str:
        if "game_file" in task.params:
            return f"alfworld:{task.params['game_file']}"
        return f"alfworld:{generate_game(task.seed, task.task_type, Difficulty(**task.params)).content_hash[:32]}"

    def reset(self, task: EnvTask) -> ResetOutcome:
        if self._engine is None:
            self._engine = AlfredEngine()
        if "game_file" in task.params:
            if self._official_root is None:
                raise official.OfficialDataError(f"task {task.task_id} is an official ALFWorld game; set ALFWORLD_DATA")
            game_key = task.params["game_file"]
            game_data = official.load_game(self._official_root, game_key)
            walkthrough = game_data.get("walkthrough")
        else:
            game = generate_game(task.seed, task.task_type, Difficulty(**task.params))
            game_key, game_data = game.content_hash, game.game_data
            # Panel games are verified (once per cache dir); a training game is solvable by
            # construction, and its walkthrough is reused if it happens to be verified already.
            is_panel = task.task_id.split("/")[1].startswith("panel-")
            walkthrough = verified_walkthrough(game, self._engine) if is_panel else cached_walkthrough(game)
        self._state, task_text = self._engine.reset(game_key, game_data)
        self._steps, self._done = 0, False
        self._plan = list(walkthrough) if walkthrough else None
        self._anchor = self._state.feedback
        return ResetOutcome(self._observation(self._state.feedback), task_text, task.task_type)

    def _observation(self, text: str) -> EnvObservation:
        return EnvObservation(
            text=text, anchor_obs=self._anchor, admissible_actions=list(self._state.admissible_commands)
        )

    def step(self, action: str | None) -> StepOutcome:
        if self._state is None:
            raise RuntimeError("alfworld: step() before reset()")
        if self._done:
            return StepOutcome(
                self._observation(NOTHING_HAPPENS), 0.0, True, self._state.won, False, info={"episode_over": True}
            )
        command = " ".join(action.lower().split()) if action else ""
        valid = command in self._state.admissible_commands
        self._steps += 1
        if valid:
            self._state = self._engine.step(command)
            self._advance_plan(command)
            text = self._state.feedback
            if not command.startswith(_OBSERVING_VERBS):  # look/examine/inventory/help leave the state as it was
                self._anchor = text
        else:
            text = NOTHING_HAPPENS
        won = self._state.won
        self._done = won or self._steps >= self.max_steps
        return StepOutcome(self._observation(text), SUCCESS_REWARD if won else 0.0, self._done, won, valid)

    def _advance_plan(self, command: str) -> None:
        if self._plan and command == self._plan[0]:
            self._plan.pop(0)
        elif not command.startswith(_OBSERVING_VERBS):
            self._plan = None

    def expert_action(self) -> str | None:
        """Next command of the planner's plan from the current state (replanned after a deviation)."""
        if self._state is None or self._done:
            return None
        if self._plan is None:
            self._plan = self._engine.plan()
        return self._plan[0] if self._plan else None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._state = None
