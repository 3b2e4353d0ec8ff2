"""Every game a ready config can draw, for training or for its held-out panel, can be won within the
config's `envs.max_steps` by the expert (the game's walkthrough, which textworld_games.py plays).

Why: a game that needs more commands than the limit is lost by every policy. Its training group has
zero advantage in every episode (it only costs time) and its panel episodes are a floor no arm can
lift. The learning study of issue 21 had one in four such games: tw-simple's house needs 8-12
commands under an 8-step limit, 0 wins in 840 evaluation episodes (issue #37). The configs leave
tw-simple out (envs.params.task_types) rather than raise the limit for every game.

Training draws games from 2^31 seeds, so the fast test bounds a task type's plan by how TextWorld's
generator builds it (below, from textworld/challenges and textworld.generator), and the slow one
checks the bound and the limit on the games themselves: every panel game and the first training
draws of the seeds a study runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from actors.envs.registry import make_env
from actors.envs.tasks import TaskSampler, panel_tasks
from actors.envs.textworld_games import DIFFICULTIES, TASK_TYPES, _generated_game
from slea.config import load_config

REPO = Path(__file__).resolve().parents[3]
# The learning configs and the embedded default: the ones whose runs the docs report on.
CONFIGS = ("configs/local.yaml", "configs/textworld-learning.yaml", "configs/textworld-study.yaml")
STUDY_SEEDS = range(8)  # issue 37 study's training seeds (docs/learning.md, "How the study of issue 37 was run")
TRAINING_DRAWS = 4  # per seed: the first tasks each seed's sampler draws


def plan_bound(task_type: str, settings: dict) -> int | None:
    """The most commands the expert's plan of a game of this type and settings can need, from how the
    generator makes it; None where the generator sets no bound (tw-simple: one house, 8-12 commands)."""
    if task_type == "coin_collector":  # a chain of quest_length rooms: moves, then "take coin"
        return (settings["level"] - 1) % 100 + 1
    if task_type == "treasure_hunter":  # quest length by level band (tw_treasure_hunter.make)
        low, high, first = (
            (1, 5, 1) if settings["level"] <= 10 else (2, 10, 11) if settings["level"] <= 20 else (3, 20, 21)
        )
        return int(np.round(np.linspace(low, high, 10))[settings["level"] - first])
    if task_type == "custom":  # chaining of exactly quest_length actions
        return settings["quest_length"]
    return None


def drawn_types(config) -> list[str]:
    return list(config.envs.params.get("task_types") or TASK_TYPES)


def plan_length(task) -> int:
    game = _generated_game(task.task_type, json.dumps(task.params["settings"], sort_keys=True), task.seed)
    return len(game.walkthrough or [])


def test_the_bounds_are_textworlds():
    assert plan_bound("coin_collector", {"level": 3}) == 3 and plan_bound("coin_collector", {"level": 106}) == 6
    assert plan_bound("treasure_hunter", {"level": 3}) == 2  # round(linspace(1, 5, 10)[2]) = round(1.89)
    assert plan_bound("treasure_hunter", {"level": 13}) == 4  # round(linspace(2, 10, 10)[2]) = round(3.78)
    assert plan_bound("custom", {"quest_length": 2}) == 2 and plan_bound("simple", {}) is None


@pytest.mark.parametrize("config_file", CONFIGS)
def test_every_task_type_a_config_draws_fits_its_step_limit(config_file):
    config = load_config(REPO / config_file)
    assert config.envs.name == "textworld"
    settings = DIFFICULTIES[config.envs.params.get("difficulty", "medium")]
    for task_type in drawn_types(config):
        bound = plan_bound(task_type, settings[task_type])
        assert bound is not None and bound <= config.envs.max_steps, (
            f"{config_file} draws {task_type} games, whose expert plan needs up to {bound or 'an unbounded number of'} "
            f"commands, over envs.max_steps {config.envs.max_steps}: leave the type out (envs.params.task_types) "
            "or raise the limit"
        )


@pytest.mark.slow  # generates about 80 games (0.2-0.8 s each) the first time
@pytest.mark.parametrize("config_file", CONFIGS)
def test_the_expert_wins_every_game_a_config_draws_within_its_step_limit(config_file):
    config = load_config(REPO / config_file)
    env = make_env("textworld", params=config.envs.params, max_steps=config.envs.max_steps)
    panel = panel_tasks(env, config.envs.eval_panel, size=config.held_out_panel_size())
    training = [
        task for seed in STUDY_SEEDS for task, _ in zip(TaskSampler(env, seed, held_out=panel), range(TRAINING_DRAWS))
    ]
    too_long = {}
    for task in panel + training:
        length = plan_length(task)
        bound = plan_bound(task.task_type, task.params["settings"]) or math.inf
        assert length <= bound, f"{task.task_id} ({task.task_type}): plan of {length} over the generator's {bound}"
        if length > config.envs.max_steps:
            too_long[task.task_id] = length
    assert not too_long, f"{config_file}: games the expert cannot win in {config.envs.max_steps} steps: {too_long}"
    assert {task.task_type for task in panel} <= set(drawn_types(config))
