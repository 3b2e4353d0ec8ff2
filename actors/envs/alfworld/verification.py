"""Solvability verdicts of generated games, cached on disk so a panel is verified once per machine.

Verifying a game means playing the planner's walkthrough through the engine until it wins (see
`engine.play_walkthrough`); in a full kitchen that costs seconds, so the verdict and the
walkthrough are stored under the cache dir, keyed by a hash of the game's content. Generation
is deterministic, so the key of a (seed, params) task is the same on every machine and a cache
dir can be shared; a change to the generator changes the content and hence the key, so stale
verdicts are never read.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from actors.envs.alfworld.engine import AlfredEngine, play_walkthrough
from actors.envs.alfworld.generator import GeneratedGame
from slea.cache_dirs import runtime_cache_dir


class UnsolvableGameError(RuntimeError):
    """A generated game whose planner walkthrough does not win: a generator bug, never expected."""


def cache_dir() -> Path:
    """Where verdicts live: the run-time cache (slea/cache_dirs.py; a shared volume on a cluster if you like)."""
    return runtime_cache_dir() / "envs" / "alfworld" / "verified"


def _verdict_path(game: GeneratedGame) -> Path:
    return cache_dir() / f"{game.content_hash[:32]}.json"


def cached_walkthrough(game: GeneratedGame) -> list[str] | None:
    """The stored walkthrough of an already verified game, None if it was never verified here."""
    path = _verdict_path(game)
    if not path.exists():
        return None
    return json.loads(path.read_text())["walkthrough"]


def verified_walkthrough(game: GeneratedGame, engine: AlfredEngine) -> list[str]:
    """The winning walkthrough of `game`, verified by playing it (once; later calls read the cache)."""
    walkthrough = cached_walkthrough(game)
    if walkthrough is not None:
        return walkthrough
    walkthrough = play_walkthrough(engine, game.content_hash, game.game_data)
    if walkthrough is None:
        raise UnsolvableGameError(
            f"generated ALFWorld game ({game.task_type}, {game.floor_plan}, '{game.task_description}') "
            "is not won by its planner walkthrough; please report it with the task's seed and params"
        )
    path = _verdict_path(game)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so concurrent actors never read half a file.
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        json.dump(
            {
                "task_type": game.task_type,
                "floor_plan": game.floor_plan,
                "task": game.task_description,
                "walkthrough": walkthrough,
            },
            tmp,
        )
    os.replace(tmp.name, path)
    return walkthrough
