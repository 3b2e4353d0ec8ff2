"""The textworld env: tw-make challenges and custom games, compiled and played by TextWorld itself."""

from __future__ import annotations

import random

import pytest

from actors.envs.registry import make_env
from actors.envs.tasks import TaskSampler, panel_tasks
from actors.envs.textworld_games import TASK_TYPES, clean_feedback, compiled_game


@pytest.fixture(scope="module")
def easy_env():
    env = make_env("textworld", params={"difficulty": "easy"})
    yield env
    env.close()


def task_of_type(env, task_type: str, split: str = "train", start: int = 0):
    """The first task of `task_type` from seed `start` on (make_task cycles the types by seed)."""
    return next(t for t in (env.make_task(s, split) for s in range(start, start + 100)) if t.task_type == task_type)


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_walkthrough_solves_every_task_type(easy_env, task_type):
    task = task_of_type(easy_env, task_type)
    reset = easy_env.reset(task)
    assert reset.task_type == task_type and reset.task_text
    assert reset.observation.text.startswith("-= ")  # the first room, without banner or objective
    assert reset.observation.admissible_actions
    outcomes = []
    while not outcomes or not outcomes[-1].done:
        outcomes.append(easy_env.step(easy_env.expert_action()))
    assert outcomes[-1].won and all(o.action_valid for o in outcomes)
    assert sum(o.reward for o in outcomes) == outcomes[-1].info["max_score"] > 0
    assert ">" not in outcomes[-1].observation.text and "The End" not in outcomes[-1].observation.text


def test_random_admissible_policy_mostly_fails():
    env = make_env("textworld", params={"difficulty": "medium"}, max_steps=30)
    rng = random.Random(0)
    wins = 0
    tasks = [env.make_task(seed, "train") for seed in range(4)]  # one of each task type
    for task in tasks:
        admissible = env.reset(task).observation.admissible_actions
        outcome = None
        while outcome is None or not outcome.done:
            outcome = env.step(rng.choice(admissible))
            admissible = outcome.observation.admissible_actions
        wins += outcome.won
    assert wins <= len(tasks) // 2
    env.close()


@pytest.mark.parametrize("action", [None, "", "x" * 10_240, "xyzzy", "go nowhere", "take"])
def test_invalid_actions_change_nothing(easy_env, action):
    task = task_of_type(easy_env, "simple")
    start = easy_env.reset(task).observation
    outcome = easy_env.step(action)
    assert not outcome.action_valid
    assert outcome.observation.text == "Nothing happens."
    assert outcome.observation.anchor_obs == start.anchor_obs
    assert outcome.observation.admissible_actions == start.admissible_actions
    assert (outcome.reward, outcome.done, outcome.won) == (0.0, False, False)
    while not outcome.done:
        outcome = easy_env.step(easy_env.expert_action())
    assert outcome.won


def test_anchor_is_the_state_not_the_games_reply(easy_env):
    """After an invalid or an observe-only command the anchor is still the state it was issued in,
    so two different states followed by invalid commands keep two anchors."""
    start = easy_env.reset(task_of_type(easy_env, "simple")).observation
    after_start = easy_env.step("xyzzy").observation
    assert after_start.text == "Nothing happens." and after_start.anchor_obs == start.anchor_obs
    changed = easy_env.step(easy_env.expert_action()).observation
    assert changed.anchor_obs == changed.text != start.anchor_obs  # a command that changed the world: its reply
    after_change = easy_env.step("xyzzy").observation
    assert after_change.text == "Nothing happens." and after_change.anchor_obs == changed.anchor_obs
    assert after_start.anchor_obs != after_change.anchor_obs
    observe_only = ["inventory", "look"] + [a for a in changed.admissible_actions if a.startswith("examine")][:2]
    for command in observe_only:
        shown = easy_env.step(command)
        assert shown.action_valid and shown.observation.text != changed.anchor_obs, command
        assert shown.observation.anchor_obs == changed.anchor_obs, command


def test_commands_match_regardless_of_case_and_spacing(easy_env):
    easy_env.reset(task_of_type(easy_env, "simple"))
    command = easy_env.expert_action()
    outcome = easy_env.step("  " + command.upper().replace(" ", "   ") + " ")
    assert outcome.action_valid


def test_same_seed_same_game(easy_env, tmp_path, monkeypatch):
    other = make_env("textworld", params={"difficulty": "easy"})
    for task_type in ("coin_collector", "custom"):
        first, second = task_of_type(easy_env, task_type), task_of_type(other, task_type)
        assert easy_env.fingerprint(first) == other.fingerprint(second)
        a = easy_env.reset(first)
        # Compile it again from scratch elsewhere: the same game comes out.
        monkeypatch.setenv("SLEA_CACHE_DIR", str(tmp_path / task_type))
        b = other.reset(second)
        assert (a.task_text, a.observation.text) == (b.task_text, b.observation.text)
        assert compiled_game(first.task_type, first.params["settings"], first.seed).is_relative_to(tmp_path / task_type)
    other.close()


def test_panels_are_disjoint_from_training():
    # The two families whose generation needs no throwaway compile keep this test quick.
    env = make_env("textworld", params={"difficulty": "easy", "task_types": ["treasure_hunter", "custom"]})
    panel = panel_tasks(env, "default", size=4)
    assert panel == panel_tasks(env, "default", size=4)
    assert all(t.task_id.startswith("textworld/panel-default/") for t in panel)
    panel_prints = {env.fingerprint(t) for t in panel}
    sampler = TaskSampler(env, seed=0, held_out=panel)
    training = [next(sampler) for _ in range(16)]
    assert not panel_prints & {env.fingerprint(t) for t in training}
    # Held-out tasks are skipped even when the training stream would draw them.
    drawn = next(TaskSampler(env, seed=1))
    assert env.fingerprint(next(TaskSampler(env, seed=1, held_out=[drawn]))) != env.fingerprint(drawn)


def test_clean_feedback_drops_prompt_status_and_end_menu():
    raw = (
        "\nYou pick up the coin from the ground.\n\n\n\nYour score has just gone up by one point.\n\n\n"
        "      *** The End ***\n\nYou scored 1 out of a possible 1, in 4 turns.\n\n\nWould you like to RESTART?\n>"
        "           -= Kitchenette =-0/3"
    )
    assert clean_feedback(raw) == "You pick up the coin from the ground.\n\nYour score has just gone up by one point."
    assert clean_feedback("\nYou can't go that way.\n\n\n>      -= Bedroom =-0/2") == "You can't go that way."
    lost = (
        "\nYou take the insect from the table.\n\n\n\n      *** You lost! ***\n\nYou scored 0 out of a possible 1,"
        " in 75 turns.\n\n\nWould you like to RESTART?\n>         -= Washroom =-0/75"
    )
    assert clean_feedback(lost) == "You take the insect from the table.\n\nYou lost!"
