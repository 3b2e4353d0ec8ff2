"""ALFWorld's text engine: TextWorld's PDDL environment behind ALFWorld's own name demangler.

This is exactly the stack `alfworld-play-tw` and ALFWorld's `AlfredTWEnv` use
(`textworld.envs.PddlEnv` wrapped by `AlfredDemangler`), so observations read
"You arrive at countertop 2. On the countertop 2, you see ..." and commands are ALFWorld's
(`go to`, `take X from Y`, `move X to Y`, `heat X with Y`, `use desklamp 1`). The planner is
TextWorld's fast-downward binding, asked for a plan from the current state.

Each engine needs its own copy of fast-downward's library (the planner keeps its task in
globals), and TextWorld loads a fresh copy per `PddlEnv`. Those copies are not independent:
fast-downward's plugin registry (`options::RawRegistry::instance()::instance_`) is a
GNU-unique symbol, so every copy registers its plugins, with pointers into itself, in the
registry of the first copy loaded. Unloading a copy leaves dangling entries there, and the
next copy's constructors crash on them unless its code happens to land at the freed
addresses (seen as a segfault in `LoadLibrary` under `pytest -n`;
tests/actors/envs/test_alfworld.py reproduces it). So a copy is never unloaded: a closed
engine hands its TextWorld env back to a per-process pool, and the process holds as many
copies as it ever had engines open at once.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass

import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
from textworld.envs import PddlEnv

INTRO_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
TASK_PREFIX = "Your task is to: "


@dataclass
class EngineState:
    """What the engine reports after a reset or a command."""

    feedback: str  # the engine's text for this transition (at reset: the room description only)
    admissible_commands: list[str]  # commands the engine accepts now, sorted
    won: bool  # the PDDL goal holds


@contextlib.contextmanager
def _argv_preserved():
    # fast-downward's translator overwrites sys.argv to configure itself; give the host process its own back.
    saved = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = saved


def split_intro(intro: str) -> tuple[str, str]:
    """(room description, task text) of ALFWorld's intro "-= Welcome... =-\\n\\n<look>\\n\\nYour task is to: ..."."""
    body = intro.replace(INTRO_BANNER, "", 1).strip()
    room, _, task = body.rpartition(TASK_PREFIX)
    return room.strip(), (TASK_PREFIX + task).strip()


class _IdleEnvs:
    """TextWorld envs of closed engines, each with its loaded fast-downward copy, ready for the next engine."""

    def __init__(self) -> None:
        self._envs: list[AlfredDemangler] = []
        self._lock = threading.Lock()

    def take(self) -> AlfredDemangler:
        with self._lock:
            if self._envs:
                return self._envs.pop()
        infos = textworld.EnvInfos(admissible_commands=True, won=True)
        return AlfredDemangler(PddlEnv(infos), shuffle=False)

    def give_back(self, env: AlfredDemangler) -> None:
        with self._lock:
            self._envs.append(env)


_IDLE_ENVS = _IdleEnvs()


class AlfredEngine:
    """One TextWorld PDDL game at a time, on a fast-downward copy no other open engine uses."""

    def __init__(self) -> None:
        self._env: AlfredDemangler | None = _IDLE_ENVS.take()
        self._loaded_key: str | None = None

    def reset(self, game_key: str, game_data: dict) -> tuple[EngineState, str]:
        """Start `game_data` (a game.tw-pddl dict) and return its first state and task text.

        Loading parses and grounds the problem; a game replayed by the same engine (the G
        trajectories of a group, or a verification followed by the episode) skips it.
        """
        with _argv_preserved():
            if game_key != self._loaded_key:
                self._loaded_key = None
                self._env.load(game_data)
                self._loaded_key = game_key
            state = self._env.reset()
        room, task_text = split_intro(state["feedback"])
        return EngineState(room, list(state["admissible_commands"]), bool(state["won"])), task_text

    def step(self, command: str) -> EngineState:
        """Apply an admissible command (the caller filters the rest: the engine would answer "Nothing happens.")."""
        state, _, _ = self._env.step(command)
        return EngineState(state["feedback"].strip(), list(state["admissible_commands"]), bool(state["won"]))

    def plan(self) -> list[str]:
        """The planner's commands from the current state to the goal ([] when it finds none).

        Asked for on demand instead of through EnvInfos.policy_commands, which would run the
        planner after every step (up to seconds in a full kitchen).
        """
        pddl_env = self._env.unwrapped
        return list(pddl_env._pddl_state.replan(pddl_env._entity_infos))

    def close(self) -> None:
        """Hand the env and its library copy to the next engine (the copy is never unloaded: see the module doc)."""
        if self._env is not None:
            _IDLE_ENVS.give_back(self._env)
            self._env = None
        self._loaded_key = None


def play_walkthrough(engine: AlfredEngine, game_key: str, game_data: dict) -> list[str] | None:
    """The planner's walkthrough of the game from its start, if playing it through the engine wins.

    This is the solvability check: it exercises the text layer (every planned command must be
    one of the engine's admissible commands), not only the planner's model of the problem.
    """
    state, _ = engine.reset(game_key, game_data)
    walkthrough = engine.plan()
    if not walkthrough:
        return None
    for command in walkthrough:
        if command not in state.admissible_commands:
            return None
        state = engine.step(command)
    return walkthrough if state.won else None
