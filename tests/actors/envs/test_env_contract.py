"""The TextEnv contract, checked on every env family of this module set with real episodes:
the expert solves every task type, a random admissible policy mostly does not, bad actions
never crash and change nothing, tasks are reproducible, panels are held out."""

from __future__ import annotations

import hashlib

import pytest

from actors.envs.registry import make_env
from actors.envs.runner import play
from actors.envs.tasks import TaskSampler, panel_tasks

ENVS = ["webshop", "search_qa", "frozenlake", "sokoban"]

# sha256 over (task type, task text, first observation, observation after one expert step) of
# seeds 0, 1, 2, 12345, computed once. A change means the generator changed: tasks recorded
# earlier (panels, logged runs) no longer mean the same game. Update only on purpose.
CONTENT_DIGESTS = {
    "webshop": "b82d3b4483f4ed54601f03aeee37d646921402bb64c822d9f12365576eb8e1a7",
    "search_qa": "32bb96ab0588b982c8c3ed0061114f8d5073adeb656cc79bd165aaad352e2438",
    "frozenlake": "9455930b49792b21fa59dde121eed52c9b10d621bf9954d98b09a47c3b581cc9",
    "sokoban": "2ad052b5c1374b287fa29ad170cd4b26613190a8e1ae28059a04f93afa431401",
}
# Random admissible play must stay well below the expert (measured: webshop 0, search_qa ~0,
# frozenlake ~0.05, sokoban ~0.03 over 100 episodes).
RANDOM_SUCCESS_CEILING = 0.2
BAD_ACTIONS = [
    None,
    "",
    " ",
    "x" * 10_000,
    "click[",
    "search[]",
    "answer[",
    "]]][[[",
    "go north",
    "\x00\n\t",
    "click[" + "y" * 10_000 + "]",
]


def content_digest(env_name: str) -> str:
    env = make_env(env_name)
    digest = hashlib.sha256()
    for seed in (0, 1, 2, 12345):
        reset = env.reset(env.make_task(seed, "train"))
        step = env.step(env.expert_action())
        digest.update(
            "\n".join([reset.task_type, reset.task_text, reset.observation.text, step.observation.text, ""]).encode()
        )
    return digest.hexdigest()


@pytest.mark.parametrize("env_name", ENVS)
def test_expert_solves_every_task_type(env_name):
    result = play(env_name, policy="expert", episodes=40, seed=7)
    assert result["success_rate"] == 1.0, result
    assert set(result["by_task_type"]) == set(make_env(env_name).task_types())
    assert result["invalid_action_rate"] == 0.0


@pytest.mark.parametrize("env_name", ENVS)
def test_random_admissible_policy_mostly_fails(env_name):
    result = play(env_name, policy="random", episodes=40, seed=7)
    assert result["success_rate"] <= RANDOM_SUCCESS_CEILING, result
    assert result["invalid_action_rate"] == 0.0  # admissible means admissible


@pytest.mark.parametrize("env_name", ENVS)
def test_bad_actions_are_invalid_and_change_nothing(env_name):
    env = make_env(env_name, max_steps=len(BAD_ACTIONS) + 1)
    reset = env.reset(env.make_task(3, "train"))
    for action in BAD_ACTIONS:
        outcome = env.step(action)
        assert not outcome.action_valid, action
        assert not outcome.done and not outcome.won and outcome.reward == 0.0
        assert outcome.observation.anchor_obs == reset.observation.anchor_obs
        assert outcome.observation.admissible_actions == reset.observation.admissible_actions
        assert outcome.observation.text.startswith("Nothing happens.")
    last = env.step(None)
    assert last.done and not last.won  # invalid steps still spend the step budget


@pytest.mark.parametrize("env_name", ENVS)
def test_same_seed_same_task_on_any_machine(env_name):
    assert content_digest(env_name) == CONTENT_DIGESTS[env_name]
    first, second = make_env(env_name), make_env(env_name)
    assert first.reset(first.make_task(99, "train")) == second.reset(second.make_task(99, "train"))


@pytest.mark.parametrize("env_name", ENVS)
def test_panels_are_fixed_and_disjoint_from_training(env_name):
    env = make_env(env_name)
    panel = panel_tasks(env, "default", size=20)
    assert panel == panel_tasks(make_env(env_name), "default", size=20)
    assert len({env.fingerprint(task) for task in panel}) == len(panel) == 20
    held_out = {env.fingerprint(task) for task in panel}
    training = [task for _, task in zip(range(300), TaskSampler(env, seed=0, held_out=panel))]
    assert not held_out & {env.fingerprint(task) for task in training}
    assert all(task.task_id.startswith(f"{env_name}/train/") for task in training)
