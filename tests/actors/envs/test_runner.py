"""The functions behind `slea play` and `slea bench envs`, run on real envs with tiny settings."""

from __future__ import annotations

import json
import random

import pytest

from actors.envs.base import EnvObservation
from actors.envs.registry import PluginError
from actors.envs.runner import EnvUnavailableError, bench_envs, play, random_action


def test_play_reports_rates_steps_throughput_and_task_types():
    result = play("sokoban", policy="expert", episodes=6, seed=1)
    json.dumps(result)
    assert result["episodes"] == 6 and result["success_rate"] == 1.0 and result["env_steps_per_s"] > 0
    assert sum(part["episodes_of_type"] for part in result["by_task_type"].values()) == 6
    assert result["mean_steps"] >= 6  # generated rooms need at least 6 moves


def test_play_on_a_panel_plays_the_panel_tasks():
    first = play("search_qa", policy="random", episodes=5, seed=1, panel="default")
    second = play("search_qa", policy="random", episodes=5, seed=1, panel="default")
    assert first == {**second, "env_steps_per_s": first["env_steps_per_s"]}
    assert first["panel"] == "default" and first["episodes"] == 5


def test_play_respects_max_steps_and_params():
    result = play("frozenlake", policy="random", episodes=5, seed=2, params={"sizes": [6]}, max_steps=3)
    assert result["max_steps"] == 3 and result["mean_steps"] <= 3 and list(result["by_task_type"]) == ["lake_6x6"]


def test_random_action_fills_free_text_slots_from_the_observation():
    observation = EnvObservation(text="", anchor_obs="red shoes on sale", admissible_actions=["search[<your query>]"])
    action = random_action(observation, random.Random(0))
    assert action.startswith("search[") and set(action[7:-1].split()) <= {"red", "shoes", "on", "sale"}
    free = EnvObservation(text="", anchor_obs="open the door", admissible_actions=[])
    assert set(random_action(free, random.Random(0)).split()) <= {"open", "the", "door"}


@pytest.fixture
def adapter_with_a_missing_dependency(tmp_path) -> str:
    """A plugin file whose spec is right but whose own import fails here (an optional dependency)."""
    adapter = tmp_path / "ghost_env.py"
    adapter.write_text("import no_such_module_anywhere\n")
    return f"{adapter}:GhostEnv"


def test_bench_envs_reports_throughput_and_skips_unimportable_envs(adapter_with_a_missing_dependency):
    report = bench_envs(
        ["webshop", "frozenlake", "ghost"],
        resets=5,
        steps=50,
        seed=0,
        plugins={"ghost": adapter_with_a_missing_dependency},
    )
    json.dumps(report)
    for name in ("webshop", "frozenlake"):
        assert report["envs"][name]["resets"] == 5 and report["envs"][name]["steps_per_s"] > 0
    assert "not available" in report["envs"]["ghost"]["skipped"]


def test_play_errors_say_what_to_do(adapter_with_a_missing_dependency):
    with pytest.raises(ValueError, match="choose one of expert, random"):
        play("webshop", policy="greedy")
    with pytest.raises(EnvUnavailableError, match="not available: No module named 'no_such_module_anywhere'"):
        play("ghost", plugins={"ghost": adapter_with_a_missing_dependency})
    with pytest.raises(PluginError, match="plugin ghost=no_such_module_anywhere:GhostEnv: no module named"):
        play("ghost", plugins={"ghost": "no_such_module_anywhere:GhostEnv"})  # a wrong spec, not a missing dependency
