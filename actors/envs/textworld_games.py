"""The `textworld` env: games made offline by TextWorld's own generator, played on its Z-machine engine.

Task types are generator families: the `tw-make` challenges `coin_collector` (walk a chain of
rooms to a coin), `treasure_hunter` (find one object among distractors; taking a wrong one loses)
and `simple` (a six-room house with a key, a door and a delivery), plus `custom` games from
`textworld.generator.make_game` (random worlds with a quest of a given length). A game is
generated from (task type, settings, seed) exactly as `tw-make ... --seed` would, compiled once
with TextWorld's bundled Inform 7 into the cache dir, and played through `textworld.start`
(Jericho plus TextWorld's state tracking), which supplies the admissible commands.

Your own games: `games_dir: /path/to/games` plays a folder of compiled TextWorld games instead
(`.z8` with the `.json` TextWorld writes beside it, e.g. from `tw-make ... --output DIR/`), with
`held_out_fraction` of them (default 0.2) held out for the evaluation panels (actors/envs/textworld_folder.py).

The expert plays the game's own walkthrough (the one its .json records, or derived from its quests)
while the episode follows it, and TextWorld's winning policy from the current state once it does not.

Params: `difficulty` "easy" | "medium" | "hard" (default "medium"), `task_types` (default all; with
`games_dir`, the folder's types), `games_dir`, `held_out_fraction`.
Reward is the game's own score gained by the step (TextWorld's points; tw-simple gives dense
sub-goal points); won is the game's quest completed. A command that is not admissible is not sent
to the game: nothing happens, and the step is invalid.

The anchor observation (see `EnvObservation`) is the game's answer to the last command that
changed the world: the first room at reset, then e.g. "You pick up the type K keycard.". An
invalid command ("Nothing happens.") and a command that only shows something (look, examine,
inventory: "You are carrying nothing." reads the same in many states) keep the anchor of the
state they were issued in.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import textworld
import textworld.challenges
from textworld.generator.game import Game, GameOptions

from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv
from actors.envs.registry import register_env
from actors.envs.textworld_folder import DEFAULT_HELD_OUT_FRACTION, GamesFolder
from slea.cache_dirs import runtime_cache_dir

NOTHING_HAPPENS = "Nothing happens."
# Commands that only show something: Inform's look, examine and inventory change no fact of the world.
OBSERVING_VERBS = ("look", "examine", "inventory")
TASK_TYPES = ("coin_collector", "treasure_hunter", "simple", "custom")

# Per difficulty, the generator settings of each task type:
# coin_collector level L: quest length (L-1)%100+1 through (L-1)//100+1 times as many rooms;
# treasure_hunter level 1-10 open rooms, 11-20 closed doors and containers, 21-30 locked ones;
# simple has one size (its dense rewards make it the easy one); custom is rooms/objects/quest length.
DIFFICULTIES: dict[str, dict[str, dict[str, Any]]] = {
    "easy": {
        "coin_collector": {"level": 3},
        "treasure_hunter": {"level": 3},
        "simple": {"rewards": "dense", "goal": "detailed", "test": False},
        "custom": {"nb_rooms": 2, "nb_objects": 4, "quest_length": 2},
    },
    "medium": {
        "coin_collector": {"level": 106},
        "treasure_hunter": {"level": 13},
        "simple": {"rewards": "balanced", "goal": "detailed", "test": False},
        "custom": {"nb_rooms": 5, "nb_objects": 10, "quest_length": 4},
    },
    "hard": {
        "coin_collector": {"level": 215},
        "treasure_hunter": {"level": 25},
        "simple": {"rewards": "sparse", "goal": "brief", "test": False},
        "custom": {"nb_rooms": 10, "nb_objects": 20, "quest_length": 8},
    },
}
_REQUEST_INFOS = textworld.EnvInfos(
    admissible_commands=True, policy_commands=True, won=True, lost=True, score=True, max_score=True, objective=True
)


def cache_dir() -> Path:
    """Compiled games, in the run-time cache (slea/cache_dirs.py). Versioned: another TextWorld makes other games."""
    return runtime_cache_dir() / "envs" / "textworld" / f"textworld-{textworld.__version__}"


def _settings_tag(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def _game_name(task_type: str, settings: dict[str, Any], seed: int) -> str:
    return f"{task_type}-{_settings_tag(settings)}-{seed}"


def _make_game(task_type: str, settings: dict[str, Any], seed: int) -> Game:
    """The game of this seed, as TextWorld's generator makes it (deterministic: seeded numpy RNGs)."""
    options = GameOptions()
    options.seeds = seed
    if task_type == "custom":
        options.nb_rooms = settings["nb_rooms"]
        options.nb_objects = settings["nb_objects"]
        length = settings["quest_length"]
        options.chaining.min_length = options.chaining.max_length = options.chaining.max_depth = length
        return textworld.generator.make_game(options)
    _, make_challenge, _ = textworld.challenges.CHALLENGES[f"tw-{task_type}"]
    return make_challenge(settings=settings, options=options)


@lru_cache(maxsize=256)
def _generated_game(task_type: str, settings_json: str, seed: int) -> Game:
    """The game of this seed, generated once per cache dir (coin_collector and simple compile a
    throwaway copy to record their walkthrough, about a second) and kept as TextWorld's .json."""
    directory = cache_dir()
    game_json = directory / f"{_game_name(task_type, json.loads(settings_json), seed)}.json"
    if game_json.exists():
        return Game.load(str(game_json))
    game = _make_game(task_type, json.loads(settings_json), seed)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False) as tmp:
        json.dump(game.serialize(), tmp)
    os.replace(tmp.name, game_json)  # write then rename: concurrent actors never read half a file
    return game


def _structure_hash(game: Game) -> str:
    # What makes two games the same game: the world, the names in it and the solution. The
    # objective's wording and the seeds in the metadata do not count.
    content = {
        "facts": sorted(str(fact) for fact in game.world.facts),
        "names": sorted((entity_id, info.name or "") for entity_id, info in game.infos.items()),
        "walkthrough": game.metadata.get("walkthrough"),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


@lru_cache(maxsize=4096)
def _folder_game_hash(game_json: Path) -> str:
    return _structure_hash(Game.load(str(game_json)))


def compiled_game(task_type: str, settings: dict[str, Any], seed: int) -> Path:
    """Path of the compiled game (.z8 beside its .json), compiling it with Inform 7 on first use.

    Compilation goes to a temporary folder and is renamed into place, so actors sharing a
    cache dir never load half a game.
    """
    directory = cache_dir()
    name = _game_name(task_type, settings, seed)
    game_file = directory / f"{name}.z8"
    if game_file.exists():
        return game_file
    game = _generated_game(task_type, json.dumps(settings, sort_keys=True), seed)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as build_dir:
        options = GameOptions()
        options.path = str(Path(build_dir) / f"{name}.z8")
        built = Path(textworld.generator.compile_game(game, options))
        os.replace(built.with_suffix(".json"), game_file.with_suffix(".json"))  # the engine reads it beside the .z8
        os.replace(built, game_file)
    return game_file


_PROMPT_AND_STATUS = re.compile(r"\n>[^\n]*$")  # Inform's prompt, followed by the status line "-= Room =-0/3"
# "*** The End ***" or "*** You lost! ***", then the score and a restart menu
_END_OF_GAME = re.compile(r"[ \t]*\*\*\* (.+?) \*\*\*.*", re.DOTALL)
_BLANK_LINES = re.compile(r"\n\s*\n(\s*\n)+")


def clean_feedback(feedback: str) -> str:
    """The game's answer without the prompt, the status line and the end-of-game menu ("You lost!" stays)."""
    text = _END_OF_GAME.sub(lambda end: "" if end.group(1) == "The End" else end.group(1), feedback)
    text = _PROMPT_AND_STATUS.sub("", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def split_intro(feedback: str, objective: str) -> str:
    """The first room's description: what follows the banner and the objective in the intro."""
    _, found, after = feedback.partition(objective.strip()) if objective.strip() else ("", "", "")
    return clean_feedback(after if found else feedback)


def _match_admissible(action: str | None, admissible: list[str]) -> str | None:
    """The admissible command the action names, ignoring case and spacing ("Take Type K keycard")."""
    if not action:
        return None
    wanted = " ".join(action.split()).lower()
    return next((command for command in admissible if command.lower() == wanted), None)


@register_env("textworld")
class TextWorldGamesEnv(TextEnv):
    """TextWorld games (tw-make challenges and custom games), one Jericho engine per env instance."""

    default_max_steps = 50

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        super().__init__(params, max_steps)
        unknown = set(self.params) - {"difficulty", "task_types", "games_dir", "held_out_fraction"}
        if unknown:
            raise ValueError(f"textworld: unknown params {sorted(unknown)}")
        self.difficulty = self.params.get("difficulty", "medium")
        if self.difficulty not in DIFFICULTIES:
            raise ValueError(f"textworld: difficulty must be one of {list(DIFFICULTIES)}, got {self.difficulty!r}")
        self._folder: GamesFolder | None = None
        if self.params.get("games_dir"):
            if "difficulty" in self.params:
                raise ValueError("textworld: difficulty sets generated games; it means nothing with games_dir")
            fraction = float(self.params.get("held_out_fraction", DEFAULT_HELD_OUT_FRACTION))
            self._folder = GamesFolder(self.params["games_dir"], fraction, self.params.get("task_types"))
        elif "held_out_fraction" in self.params:
            raise ValueError("textworld: held_out_fraction splits a games_dir; give games_dir too")
        self._task_types = tuple(
            self._folder.task_types() if self._folder else self.params.get("task_types") or TASK_TYPES
        )
        if not self._folder and set(self._task_types) - set(TASK_TYPES):
            raise ValueError(
                f"textworld: unknown task types {sorted(set(self._task_types) - set(TASK_TYPES))}; "
                f"known: {list(TASK_TYPES)}"
            )
        self._engine: textworld.Environment | None = None
        self._loaded: Path | None = None
        self._state: textworld.GameState | None = None
        self._admissible: list[str] = []
        self._anchor = ""  # text of the current state: the game's answer to the last command that changed it
        self._walkthrough: list[str] = []  # the game's own solution from its start
        self._on_walkthrough: int | None = 0  # next walkthrough command while the episode follows it, else None
        self._steps = 0
        self._done = False

    def task_types(self) -> list[str]:
        return list(self._task_types)

    def make_task(self, seed: int, split: str) -> EnvTask:
        if self._folder is not None:
            game = self._folder.pick(seed, split)
            return EnvTask("textworld", f"textworld/{split}/{seed}", game.task_type, seed, params={"game": game.name})
        task_type = self._task_types[seed % len(self._task_types)]
        settings = DIFFICULTIES[self.difficulty][task_type]
        return EnvTask("textworld", f"textworld/{split}/{seed}", task_type, seed, params={"settings": dict(settings)})

    def fingerprint(self, task: EnvTask) -> str:
        """Hash of the generated world and solution: small settings can give the same game for two seeds.

        The settings are part of it: tw-simple makes the same house with dense or sparse rewards.
        """
        if "game" in task.params:  # a games_dir game: two files can hold the same game
            json_file = self._game_file(task).with_suffix(".json")
            return f"textworld:{task.task_type}:{_folder_game_hash(json_file)[:32]}"
        settings = task.params["settings"]
        game = _generated_game(task.task_type, json.dumps(settings, sort_keys=True), task.seed)
        return f"textworld:{task.task_type}:{_settings_tag(settings)}:{_structure_hash(game)[:32]}"

    def _game_file(self, task: EnvTask) -> Path:
        if "game" not in task.params:
            return compiled_game(task.task_type, task.params["settings"], task.seed)
        if self._folder is None:
            raise ValueError(f"textworld: task {task.task_id} is a games_dir game; this env has no games_dir")
        return self._folder.game_file(task.params["game"])

    def reset(self, task: EnvTask) -> ResetOutcome:
        game_file = self._game_file(task)
        if game_file != self._loaded:
            # A fresh engine per game rather than engine.load(): Jericho's load() of a game it has
            # loaded before keeps the support flags of the game in between, and then cannot find the
            # player (games A, B, A with B from tw-make). Starting costs what loading does (~25 ms).
            if self._engine is not None:
                self._engine.close()
            self._engine = textworld.start(str(game_file), request_infos=_REQUEST_INFOS)
        self._loaded = game_file
        self._state = self._engine.reset()
        self._steps, self._done = 0, False
        self._admissible = list(self._state["admissible_commands"])
        self._walkthrough, self._on_walkthrough = list(self._state["game"].walkthrough or []), 0
        objective = self._state["objective"] or ""
        room = split_intro(self._state.feedback, objective)
        self._anchor = room
        return ResetOutcome(self._observation(room), objective.strip(), task.task_type)

    def _observation(self, text: str) -> EnvObservation:
        return EnvObservation(text=text, anchor_obs=self._anchor, admissible_actions=list(self._admissible))

    def step(self, action: str | None) -> StepOutcome:
        if self._state is None:
            raise RuntimeError("textworld: step() before reset()")
        if self._done:
            return StepOutcome(
                self._observation(NOTHING_HAPPENS),
                0.0,
                True,
                bool(self._state["won"]),
                False,
                info={"episode_over": True},
            )
        command = _match_admissible(action, self._admissible)
        valid = command is not None
        self._steps += 1
        reward = 0.0
        if valid:
            previous_score = self._state["score"]
            self._state, _, game_over = self._engine.step(command)
            reward = float(self._state["score"] - previous_score)
            self._admissible = [] if game_over else list(self._state["admissible_commands"])
            text = clean_feedback(self._state.feedback)
            observing = command.lower().startswith(OBSERVING_VERBS)
            if not observing:
                self._anchor = text
            self._follow_walkthrough(command, observing)
        else:
            game_over = False
            text = NOTHING_HAPPENS
        won = bool(self._state["won"])
        self._done = game_over or won or bool(self._state["lost"]) or self._steps >= self.max_steps
        info = {"score": self._state["score"], "max_score": self._state["max_score"], "lost": bool(self._state["lost"])}
        return StepOutcome(self._observation(text), reward, self._done, won, valid, info=info)

    def _follow_walkthrough(self, command: str, observing: bool) -> None:
        """Advance along the walkthrough, or leave it for good on a world-changing command it does not have."""
        at = self._on_walkthrough
        if at is not None and at < len(self._walkthrough) and _match_admissible(self._walkthrough[at], [command]):
            self._on_walkthrough = at + 1
        elif not observing:
            self._on_walkthrough = None

    def expert_action(self) -> str | None:
        """The game's walkthrough while the episode follows it (and it is admissible), else the first
        command of TextWorld's winning policy from the current state."""
        if self._state is None or self._done:
            return None
        at = self._on_walkthrough
        if at is not None and at < len(self._walkthrough):
            command = _match_admissible(self._walkthrough[at], self._admissible)
            if command is not None:
                return command
        policy = self._state["policy_commands"] or []
        return policy[0] if policy else None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._loaded = None
        self._state = None
