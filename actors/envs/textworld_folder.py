"""The `textworld` env's games from a folder of the user's own compiled TextWorld games (param `games_dir`).

Every Z-machine game (`.z1`-`.z8`, what `tw-make ... --output DIR/` writes) anywhere under the
folder is one game, played by the same engine as the generated ones; TextWorld needs the `.json` it
writes beside each game (admissible commands, score, quests and the walkthrough). Glulx `.ulx` games
cannot be played: TextWorld 1.7 removed its Glulx engine, so they are an error, not skipped in silence.

Task type of a game: its first subfolder under games_dir (`games/cooking/g1.z8` is "cooking"), else the
TextWorld challenge its file name starts with (tw-make names a game by its uuid,
`tw-coin_collector-...`), else "custom".

Held out: a game belongs to the evaluation panels when a hash of its path under the folder falls below
`held_out_fraction` (default 0.2), so the split of a game never depends on which other games are in the
folder; at least one game is held out and one trains when there are two or more. Panels draw from the
held-out games only (a panel is at most that many tasks) and training from the others, so `slea train`
on a folder always evaluates on games it never plays. A folder of one game plays it for both.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import textworld.challenges

_ZMACHINE = re.compile(r"\.z[1-8]$")
DEFAULT_HELD_OUT_FRACTION = 0.2


@dataclass(frozen=True)
class FolderGame:
    """One compiled game of the folder."""

    name: str  # its path under games_dir, e.g. "cooking/game_3.z8": what a task records to find it again
    task_type: str  # first subfolder, else the tw-make challenge in its file name, else "custom"
    held_out_key: float  # in [0, 1), from a hash of `name`: held out when below the folder's fraction


def _task_type(name: str) -> str:
    parts = name.split("/")
    if len(parts) > 1:
        return parts[0]
    challenge = next((c for c in textworld.challenges.CHALLENGES if parts[0].startswith(f"{c}-")), None)
    return challenge.removeprefix("tw-") if challenge else "custom"


@lru_cache(maxsize=16)
def list_games(directory: Path) -> tuple[FolderGame, ...]:
    """The playable games under `directory`, sorted by path; errors say what is wrong with the folder."""
    if not directory.is_dir():
        raise ValueError(f"textworld: games_dir {str(directory)!r} is not a folder")
    files = sorted(path for path in directory.rglob("*") if _ZMACHINE.search(path.name) and path.is_file())
    glulx = sorted(path for path in directory.rglob("*.ulx") if not path.with_suffix(".z8").is_file())
    if glulx:
        raise ValueError(
            f"textworld: {len(glulx)} Glulx games in {directory} (e.g. {glulx[0].name}): TextWorld "
            f"{textworld.__version__} plays only Z-machine games; recompile them with `tw-make ... --format z8`"
        )
    lacking = [path for path in files if not path.with_suffix(".json").is_file()]
    if lacking:
        raise ValueError(
            f"textworld: {len(lacking)} games in {directory} have no TextWorld .json beside them "
            f"(e.g. {lacking[0].name}); copy each game's .json next to it"
        )
    if not files:
        raise ValueError(f"textworld: games_dir {directory} has no compiled games (.z8 with their .json)")
    names = [path.relative_to(directory).as_posix() for path in files]
    return tuple(FolderGame(name, _task_type(name), _hash_key(name)) for name in names)


def _hash_key(name: str) -> float:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") / 2**64


class GamesFolder:
    """A folder's games, split once into training games and held-out (panel) games."""

    def __init__(
        self,
        directory: str | Path,
        held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
        task_types: list[str] | None = None,
    ):
        if not 0 < held_out_fraction < 1:
            raise ValueError(f"textworld: held_out_fraction must be between 0 and 1, got {held_out_fraction!r}")
        self.root = Path(directory).expanduser().resolve()
        games = list_games(self.root)
        known = sorted({game.task_type for game in games})
        unknown = sorted(set(task_types or ()) - set(known))
        if unknown:
            raise ValueError(f"textworld: no games of task types {unknown} in {self.root}; its types: {known}")
        games = [game for game in games if not task_types or game.task_type in task_types]
        self.held_out = [game for game in games if game.held_out_key < held_out_fraction]
        self.train = [game for game in games if game.held_out_key >= held_out_fraction]
        by_key = sorted(games, key=lambda game: game.held_out_key)
        if len(games) > 1 and not self.held_out:
            self.held_out, self.train = by_key[:1], by_key[1:]
        elif len(games) > 1 and not self.train:
            self.held_out, self.train = by_key[:-1], by_key[-1:]
        elif len(games) == 1:
            self.held_out = self.train = games

    def task_types(self) -> list[str]:
        return sorted({game.task_type for game in self.train + self.held_out})

    def pick(self, seed: int, split: str) -> FolderGame:
        """The game of this seed: panels ('panel-<name>') draw from the held-out games, training from the rest."""
        games = self.held_out if split.startswith("panel-") else self.train
        return games[seed % len(games)]

    def game_file(self, name: str) -> Path:
        path = self.root / name
        if not path.is_file():
            raise FileNotFoundError(f"textworld: game {name!r} is not in games_dir {self.root} (any more)")
        return path
