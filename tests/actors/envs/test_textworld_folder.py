"""The textworld env on a folder of the user's own compiled games (param `games_dir`): games made by
TextWorld's generator (the project's `compiled_game` and the `tw-make` command), played by the
expert from each game's own walkthrough and by a random policy, with panels from the held-out share."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actors.envs.registry import make_env
from actors.envs.runner import play
from actors.envs.tasks import TaskSampler, panel_tasks
from actors.envs.textworld_folder import GamesFolder, list_games
from actors.envs.textworld_games import DIFFICULTIES, compiled_game

SLEA = [sys.executable, "-m", "driver.cli"]
TW_MAKE = Path(sys.executable).parent / "tw-make"


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory) -> Path:
    """Four games: three from the project's generator, in one subfolder per kind as a user might sort
    them, and one straight from `tw-make` with the file name it gives (the game's uuid)."""
    folder = tmp_path_factory.mktemp("my-games")
    for task_type, seed in [("coin_collector", 1), ("treasure_hunter", 3), ("simple", 4)]:
        game = compiled_game(task_type, DIFFICULTIES["easy"][task_type], seed)
        (folder / task_type).mkdir(exist_ok=True)
        for suffix in (".z8", ".json"):
            shutil.copy(game.with_suffix(suffix), folder / task_type / game.with_suffix(suffix).name)
    made = [str(TW_MAKE), "tw-treasure_hunter", "--level", "2", "--seed", "5", "--format", "z8", "--silent"]
    subprocess.run([*made, "--output", f"{folder}/"], check=True, capture_output=True, timeout=120)
    return folder


def test_expert_wins_every_game_of_the_folder_from_the_command_line(games_dir):
    result = subprocess.run(
        [*SLEA, "play", "--env", "textworld", "--param", f"games_dir={games_dir}", "--episodes", "12", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["success_rate"] == 1.0 and report["invalid_action_rate"] == 0.0, report
    assert set(report["by_task_type"]) <= {"coin_collector", "treasure_hunter", "simple"}
    panel = play("textworld", "expert", episodes=10, params={"games_dir": str(games_dir)}, panel="default")
    assert panel["success_rate"] == 1.0 and panel["episodes"] >= 1, panel


def test_random_policy_plays_admissible_commands(games_dir):
    result = subprocess.run(
        [*SLEA, "play", "--env", "textworld", "--param", f"games_dir={games_dir}", "--policy", "random"]
        + ["--episodes", "6", "--max-steps", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["episodes"] == 6 and report["invalid_action_rate"] == 0.0
    assert report["success_rate"] < 1.0  # ten random commands do not solve every game (seeded: always so)


def test_task_types_come_from_subfolders_and_tw_make_names(games_dir):
    games = {game.name: game.task_type for game in list_games(games_dir.resolve())}
    assert len(games) == 4
    (tw_made,) = [name for name in games if name.startswith("tw-")]
    assert games[tw_made] == "treasure_hunter" and tw_made.endswith(".z8")
    assert games["coin_collector/coin_collector-2187ce58-1.z8"] == "coin_collector"
    env = make_env("textworld", {"games_dir": str(games_dir)})
    assert env.task_types() == ["coin_collector", "simple", "treasure_hunter"]
    only = make_env("textworld", {"games_dir": str(games_dir), "task_types": ["coin_collector"]})
    assert {only.make_task(seed, "train").task_type for seed in range(20)} == {"coin_collector"}


def test_panels_hold_out_a_share_of_the_folder_that_training_never_plays(games_dir):
    env = make_env("textworld", {"games_dir": str(games_dir)})
    held_out = {game.name for game in env._folder.held_out}
    trained = {game.name for game in env._folder.train}
    assert held_out and trained and not held_out & trained and len(held_out | trained) == 4
    panel = panel_tasks(env, "default", size=50)  # more than the folder holds: the panel is its held-out games
    assert {task.params["game"] for task in panel} == held_out and len(panel) == len(held_out)
    assert panel == panel_tasks(make_env("textworld", {"games_dir": str(games_dir)}), "default", size=50)
    training = [task for _, task in zip(range(40), TaskSampler(env, seed=0, held_out=panel))]
    assert {task.params["game"] for task in training} == trained
    assert all(task.task_id.startswith("textworld/train/") for task in training)
    half = GamesFolder(games_dir, held_out_fraction=0.5)
    assert held_out <= {game.name for game in half.held_out}  # a game's side depends on the fraction, not the others


def test_expert_follows_the_walkthrough_and_replans_off_it(games_dir):
    env = make_env("textworld", {"games_dir": str(games_dir)})
    tasks = (env.make_task(seed, split) for split in ("train", "panel-x") for seed in range(10))
    task = next(task for task in tasks if task.task_type == "simple")
    walkthrough = json.loads((games_dir / task.params["game"]).with_suffix(".json").read_text())["metadata"]
    walkthrough = walkthrough["walkthrough"]
    observation = env.reset(task).observation
    assert env.expert_action() == walkthrough[0]
    detour = next(a for a in observation.admissible_actions if a.startswith("open ") and a != walkthrough[0])
    outcome = env.step(detour)  # off the walkthrough: TextWorld's plan from here takes over
    assert outcome.action_valid and env.expert_action() != walkthrough[1]
    while not outcome.done:
        outcome = env.step(env.expert_action())
    assert outcome.won
    env.close()


def test_a_folder_that_cannot_be_played_says_why(tmp_path):
    with pytest.raises(ValueError, match="is not a folder"):
        make_env("textworld", {"games_dir": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="no compiled games"):
        make_env("textworld", {"games_dir": str(tmp_path)})
    (tmp_path / "old.ulx").write_bytes(b"")
    with pytest.raises(ValueError, match=r"Glulx games .*old\.ulx.*--format z8"):
        make_env("textworld", {"games_dir": str(tmp_path)})
    (tmp_path / "old.ulx").unlink()
    (tmp_path / "lonely.z8").write_bytes(b"")
    with pytest.raises(ValueError, match=r"no TextWorld \.json beside them \(e\.g\. lonely\.z8\)"):
        make_env("textworld", {"games_dir": str(tmp_path)})


def test_params_that_mean_nothing_with_a_folder_are_errors(games_dir):
    with pytest.raises(ValueError, match="difficulty .* games_dir"):
        make_env("textworld", {"games_dir": str(games_dir), "difficulty": "easy"})
    with pytest.raises(ValueError, match="give games_dir too"):
        make_env("textworld", {"held_out_fraction": 0.3})
    with pytest.raises(ValueError, match="between 0 and 1"):
        make_env("textworld", {"games_dir": str(games_dir), "held_out_fraction": 1.0})
    with pytest.raises(ValueError, match=r"no games of task types \['cooking'\]"):
        make_env("textworld", {"games_dir": str(games_dir), "task_types": ["cooking"]})
