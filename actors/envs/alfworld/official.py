"""The official ALFWorld games, when a user has downloaded them (`alfworld-download`, ALFWORLD_DATA).

The layout is ALFWorld's: `$ALFWORLD_DATA/json_2.1.1/<split>/<task dir>/<trial>/game.tw-pddl`,
the task dir named after the task type ("pick_clean_then_place_in_recep-Mug-None-CoffeeMachine-10").
Games are selected as ALFWorld's `AlfredTWEnv.collect_game_files` does: only those marked
solvable, no movable-receptacle or sliced variants.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

import alfworld.info

JSON_DIR = "json_2.1.1"
TRAIN_SPLIT = "train"
# ALFWorld's evaluation splits: rooms seen in training (valid_seen) and unseen rooms (valid_unseen),
# the one papers report; a panel named after a split plays it, any other panel plays valid_unseen.
EVAL_SPLITS = ("valid_seen", "valid_unseen")
DEFAULT_EVAL_SPLIT = "valid_unseen"


class OfficialDataError(FileNotFoundError):
    """ALFWORLD_DATA is set but does not hold ALFWorld's games."""


def official_data_root() -> Path | None:
    """The ALFWORLD_DATA folder when it holds the games, else None.

    Importing `alfworld` sets ALFWORLD_DATA to its default download folder when the user did not;
    that folder without games just means "no official data". Any other folder without games is a
    mistake the user should hear about.
    """
    value = os.environ.get("ALFWORLD_DATA")
    if not value:
        return None
    root = Path(value).expanduser()
    if (root / JSON_DIR).is_dir():
        return root
    default_root = Path(alfworld.info._default_alfworld_cache)
    if root.resolve() == default_root.resolve():
        return None
    raise OfficialDataError(
        f"ALFWORLD_DATA={value} has no {JSON_DIR}/ folder; download the games with `alfworld-download` "
        "into that folder, or unset ALFWORLD_DATA to play generated games"
    )


def split_for(task_split: str) -> str:
    """ALFWorld split that a task split ('train' or 'panel-<name>') draws its games from."""
    if task_split == TRAIN_SPLIT:
        return TRAIN_SPLIT
    panel = task_split.removeprefix("panel-")
    return panel if panel in EVAL_SPLITS else DEFAULT_EVAL_SPLIT


def task_type_of(game_file: str) -> str:
    """Task type encoded in the task folder name of a game path."""
    return Path(game_file).parent.parent.name.split("-")[0]


@lru_cache(maxsize=8)
def game_files(root: Path, split: str, task_types: tuple[str, ...]) -> tuple[str, ...]:
    """Solvable games of a split, as paths relative to `root`, sorted (the same list on every machine)."""
    split_dir = root / JSON_DIR / split
    if not split_dir.is_dir():
        raise OfficialDataError(f"{split_dir} does not exist; is ALFWORLD_DATA a complete `alfworld-download`?")
    games = []
    for game_file in sorted(split_dir.glob("*/*/game.tw-pddl")):
        relative = str(game_file.relative_to(root))
        if "movable" in relative or "Sliced" in relative or task_type_of(relative) not in task_types:
            continue
        if json.loads(game_file.read_text()).get("solvable"):
            games.append(relative)
    if not games:
        raise OfficialDataError(
            f"no solvable game.tw-pddl of task types {list(task_types)} under {split_dir}; "
            "run `alfworld-generate` or re-download the games"
        )
    return tuple(games)


def load_game(root: Path, game_file: str) -> dict:
    """The game.tw-pddl content (domain, grammar with the task sentence, problem, walkthrough)."""
    return json.loads((root / game_file).read_text())
