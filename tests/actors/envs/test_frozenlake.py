"""FrozenLake specifics: the text board over gymnasium's engine, walls, holes, slipperiness."""

from __future__ import annotations

from actors.envs.registry import make_env
from actors.envs.runner import play


def test_board_marks_player_holes_and_goal():
    env = make_env("frozenlake", {"sizes": [4]})
    task = env.make_task(2, "train")
    assert task.task_type == "lake_4x4"
    board = env.reset(task).observation.text.splitlines()
    assert len(board) == 4 and board[0].split()[0] == "P" and board[-1].split()[-1] == "G"
    assert sum(row.count("O") for row in board) == sum(row.count("H") for row in env.desc)


def test_walking_into_the_edge_is_valid_and_stays():
    env = make_env("frozenlake")
    start = env.reset(env.make_task(2, "train")).observation
    outcome = env.step("left")
    assert outcome.action_valid and outcome.observation.anchor_obs == start.anchor_obs and not outcome.done


def test_falling_into_a_hole_loses():
    env = make_env("frozenlake", {"sizes": [6]})
    for seed in range(50):
        env.reset(env.make_task(seed, "train"))
        row, col = next((r, c) for r in range(6) for c in range(6) if env.desc[r][c] == "H")
        if row == 0:  # a hole in the top row: walk right into it
            outcome = None
            for _ in range(col):
                outcome = env.step("right")
            assert outcome.done and not outcome.won and outcome.info["fell_in_hole"]
            assert "X" in outcome.observation.text
            return
    raise AssertionError("no 6x6 lake among 50 seeds has a hole in its top row")


def test_slippery_lake_plays_and_says_so():
    env = make_env("frozenlake", {"is_slippery": True})
    assert "slippery" in env.reset(env.make_task(1, "train")).task_text
    result = play("frozenlake", "expert", episodes=20, seed=3, params={"is_slippery": True})
    assert result["invalid_action_rate"] == 0.0 and 0.0 < result["success_rate"] < 1.0
