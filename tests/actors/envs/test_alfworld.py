"""The alfworld env on the real ALFWorld/TextWorld PDDL engine: generated games for all six task types."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from actors.envs.alfworld import catalog
from actors.envs.alfworld.generator import DIFFICULTIES, Difficulty, generate_game
from actors.envs.alfworld.official import OfficialDataError
from actors.envs.alfworld.verification import cached_walkthrough
from actors.envs.registry import make_env
from actors.envs.tasks import TaskSampler, panel_tasks

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def easy_env():
    env = make_env("alfworld", params={"difficulty": "easy", "source": "generated"})
    yield env
    env.close()


def play_expert(env, task) -> tuple[list, int]:
    reset = env.reset(task)
    assert reset.observation.admissible_actions
    outcomes = []
    while not outcomes or not outcomes[-1].done:
        outcomes.append(env.step(env.expert_action()))
    return outcomes, len(outcomes)


@pytest.mark.parametrize("task_type", catalog.TASK_TYPES)
def test_expert_solves_every_task_type(task_type):
    env = make_env("alfworld", params={"difficulty": "medium", "source": "generated", "task_types": [task_type]})
    for seed in (11, 12):
        task = env.make_task(seed, "panel-test")
        assert task.task_type == task_type
        outcomes, steps = play_expert(env, task)
        assert outcomes[-1].won and outcomes[-1].done
        assert all(o.action_valid for o in outcomes)
        assert [o.reward for o in outcomes] == [0.0] * (steps - 1) + [10.0]
        assert steps < env.max_steps
        # A panel game was verified by playing its walkthrough, and the verdict is cached.
        assert cached_walkthrough(generate_game(task.seed, task_type, Difficulty(**task.params)))
    env.close()


def test_expert_replans_after_a_detour(easy_env):
    task = easy_env.make_task(5, "train")
    reset = easy_env.reset(task)
    rng = random.Random(0)
    admissible = reset.observation.admissible_actions
    for _ in range(4):  # wander off the plan first
        outcome = easy_env.step(rng.choice([a for a in admissible if a.startswith("go to")]))
        admissible = outcome.observation.admissible_actions
    while not outcome.done:
        outcome = easy_env.step(easy_env.expert_action())
    assert outcome.won and outcome.reward == 10.0


def test_random_admissible_policy_mostly_fails(easy_env):
    rng = random.Random(0)
    wins = 0
    tasks = [easy_env.make_task(seed, "train") for seed in range(100, 106)]
    for task in tasks:
        admissible = easy_env.reset(task).observation.admissible_actions
        outcome = None
        while outcome is None or not outcome.done:
            outcome = easy_env.step(rng.choice(admissible))
            admissible = outcome.observation.admissible_actions
        wins += outcome.won
    assert wins <= len(tasks) // 3


@pytest.mark.parametrize("action", [None, "", " ", "x" * 10_240, "fly to the moon", "go to", "take", "go to nowhere 9"])
def test_invalid_actions_change_nothing(easy_env, action):
    task = easy_env.make_task(7, "train")
    start = easy_env.reset(task).observation
    outcome = easy_env.step(action)
    assert not outcome.action_valid
    assert outcome.observation.text == "Nothing happens."
    assert outcome.observation.anchor_obs == start.anchor_obs
    assert outcome.observation.admissible_actions == start.admissible_actions
    assert (outcome.reward, outcome.done, outcome.won) == (0.0, False, False)
    # The state is the start state: the expert still wins from here.
    while not outcome.done:
        outcome = easy_env.step(easy_env.expert_action())
    assert outcome.won


def test_anchor_is_the_state_not_the_engines_reply(easy_env):
    """After an invalid or an observe-only command the anchor is still the state it was issued in,
    so two different states followed by invalid commands keep two anchors."""
    start = easy_env.reset(easy_env.make_task(7, "train")).observation
    after_start = easy_env.step("fly to the moon").observation
    assert after_start.text == "Nothing happens." and after_start.anchor_obs == start.anchor_obs
    moved = easy_env.step(next(a for a in start.admissible_actions if a.startswith("go to"))).observation
    assert (
        moved.text.startswith("You arrive at") and moved.anchor_obs == moved.text
    )  # a move: its reply is the new state
    after_move = easy_env.step("fly to the moon").observation
    assert after_move.text == "Nothing happens." and after_move.anchor_obs == moved.anchor_obs
    assert after_start.anchor_obs != after_move.anchor_obs
    observe_only = ["inventory", "look", "help"] + [a for a in moved.admissible_actions if a.startswith("examine")]
    for command in observe_only:
        shown = easy_env.step(command)
        assert shown.action_valid and shown.observation.text != moved.anchor_obs, command
        assert shown.observation.anchor_obs == moved.anchor_obs, command


def test_commands_are_alfworlds():
    env = make_env(
        "alfworld",
        params={"difficulty": "easy", "source": "generated", "task_types": ["pick_heat_then_place_in_recep"]},
    )
    reset = env.reset(env.make_task(3, "train"))
    assert reset.observation.text.startswith("You are in the middle of a room. Looking quickly around you, you see")
    assert reset.task_text.startswith("Your task is to: ")
    assert "Your task is to" not in reset.observation.anchor_obs
    moves = set(reset.observation.admissible_actions) - {"inventory", "look", "help"}
    assert moves and all(a.startswith("go to ") for a in moves)
    texts, commands = [], []
    outcome = None
    while outcome is None or not outcome.done:
        commands.append(env.expert_action())
        outcome = env.step(commands[-1])
        texts.append(outcome.observation.text)
    assert any(c.startswith("heat ") and " with microwave " in c for c in commands)
    assert any(t.startswith("You arrive at ") for t in texts)
    assert texts[-1].startswith("You move the ")
    env.close()


def test_episode_ends_at_max_steps():
    env = make_env("alfworld", params={"difficulty": "easy", "source": "generated"}, max_steps=3)
    env.reset(env.make_task(1, "train"))
    outcomes = [env.step(None) for _ in range(3)]
    assert [o.done for o in outcomes] == [False, False, True]
    assert not outcomes[-1].won
    after = env.step(env.expert_action())
    assert after.done and not after.action_valid
    env.close()


def test_same_seed_same_task(easy_env):
    other = make_env("alfworld", params={"difficulty": "easy", "source": "generated"})
    for seed in (0, 1, 2):
        first, second = easy_env.make_task(seed, "train"), other.make_task(seed, "train")
        assert easy_env.fingerprint(first) == other.fingerprint(second)
        a, b = easy_env.reset(first), other.reset(second)
        assert (a.task_text, a.observation.text, a.task_type) == (b.task_text, b.observation.text, b.task_type)
    assert len({easy_env.fingerprint(easy_env.make_task(s, "train")) for s in range(30)}) == 30
    other.close()


ENGINE_CHURN = """
import mmap
from actors.envs.alfworld.engine import AlfredEngine

first, second = AlfredEngine(), AlfredEngine()
second.close()
# Occupy the address range an unloaded library copy would have left, so a copy registered in
# fast-downward's shared plugin registry can only survive by still being mapped.
holes = [mmap.mmap(-1, 64 << 20) for _ in range(4)]
third, fourth = AlfredEngine(), AlfredEngine()
for engine in (first, third, fourth):
    engine.close()
print("survived")
"""


def test_closing_and_opening_engines_does_not_crash_the_process():
    """Before engines pooled their fast-downward copies, this segfaulted loading the third copy."""
    result = subprocess.run([sys.executable, "-c", ENGINE_CHURN], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-3000:]}"
    assert result.stdout.strip() == "survived"


def test_generation_does_not_depend_on_the_process():
    """Another interpreter with another hash seed builds byte-identical games."""
    code = (
        "from actors.envs.alfworld.generator import DIFFICULTIES, generate_game;"
        "from actors.envs.alfworld.catalog import TASK_TYPES;"
        "print([generate_game(s, t, DIFFICULTIES['full']).content_hash for s in (3, 4) for t in TASK_TYPES])"
    )
    other_hash_seed = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=other_hash_seed, capture_output=True, text=True, check=True
    )
    here = [generate_game(s, t, DIFFICULTIES["full"]).content_hash for s in (3, 4) for t in catalog.TASK_TYPES]
    assert result.stdout.strip() == str(here)


def test_panels_are_disjoint_from_training(easy_env):
    panel = panel_tasks(easy_env, "default", size=8)
    assert len({easy_env.fingerprint(t) for t in panel}) == 8
    assert all(t.task_id.startswith("alfworld/panel-default/") for t in panel)
    assert panel == panel_tasks(easy_env, "default", size=8)
    panel_prints = {easy_env.fingerprint(t) for t in panel}
    sampler = TaskSampler(easy_env, seed=0, held_out=panel)
    training = [next(sampler) for _ in range(200)]
    assert not panel_prints & {easy_env.fingerprint(t) for t in training}
    # Held-out tasks are skipped even when the training stream would draw them.
    drawn = [next(TaskSampler(easy_env, seed=1))]
    skipping = TaskSampler(easy_env, seed=1, held_out=drawn)
    assert easy_env.fingerprint(next(skipping)) != easy_env.fingerprint(drawn[0])


def test_unknown_params_are_rejected():
    with pytest.raises(ValueError, match="difficulty"):
        make_env("alfworld", params={"difficulty": "impossible"})
    with pytest.raises(ValueError, match="unknown task types"):
        make_env("alfworld", params={"task_types": ["make_coffee"]})
    with pytest.raises(ValueError, match="unknown params"):
        make_env("alfworld", params={"rooms": 3})


def test_malformed_official_data_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(OfficialDataError, match="json_2.1.1"):
        make_env("alfworld")


def test_official_games_are_played_when_present(tmp_path, monkeypatch):
    """A folder laid out like `alfworld-download`'s (here holding generated games) is played instead."""
    for split, seed in (("train", 21), ("valid_unseen", 22)):
        game = generate_game(seed, "pick_and_place_simple", Difficulty(4, 1, 1))
        trial = tmp_path / "json_2.1.1" / split / f"pick_and_place_simple-{game.object_type}-None-x-1" / "trial_1"
        trial.mkdir(parents=True)
        (trial / "game.tw-pddl").write_text(json.dumps({**game.game_data, "solvable": True, "walkthrough": None}))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    env = make_env("alfworld")
    task = env.make_task(5, "panel-default")
    assert "valid_unseen" in task.params["game_file"] and task.task_type == "pick_and_place_simple"
    assert "train" in env.make_task(5, "train").params["game_file"]
    reset = env.reset(task)
    assert reset.task_text == f"Your task is to: {game.task_description}."
    outcomes, _ = play_expert(env, task)
    assert outcomes[-1].won
    env.close()
