"""Sokoban specifics: push rules, reverse-play generation, the solver, the board fingerprint."""

from __future__ import annotations

from actors.envs.registry import make_env
from actors.envs.sokoban.room import generate_room
from actors.envs.sokoban.rules import step_in
from actors.envs.sokoban.solver import solve

# a corridor: (1,1) (1,2) (1,3) (1,4)
CORRIDOR = frozenset({(1, 1), (1, 2), (1, 3), (1, 4)})


def test_push_rules():
    assert step_in(CORRIDOR, frozenset({(1, 2)}), (1, 1), "right") == ((1, 2), frozenset({(1, 3)}))
    assert step_in(CORRIDOR, frozenset({(1, 4)}), (1, 3), "right") == ((1, 3), frozenset({(1, 4)}))  # wall
    assert step_in(CORRIDOR, frozenset({(1, 2), (1, 3)}), (1, 1), "right") == ((1, 1), frozenset({(1, 2), (1, 3)}))
    assert step_in(CORRIDOR, frozenset(), (1, 1), "up") == ((1, 1), frozenset())


def test_solver_is_optimal_and_knows_dead_ends():
    assert solve(CORRIDOR, frozenset({(1, 4)}), frozenset({(1, 2)}), (1, 1)) == ["right", "right"]
    assert solve(CORRIDOR, frozenset({(1, 1)}), frozenset({(1, 2)}), (1, 3)) == ["left"]
    assert solve(CORRIDOR, frozenset({(1, 3)}), frozenset({(1, 1)}), (1, 2)) is None  # a box in a corner stays


def test_generated_rooms_are_solvable_and_not_trivial():
    for seed in range(40):
        room = generate_room(seed, 7, 7, 2, 30, 6)
        assert len(room.boxes) == len(room.targets) == 2 and room.boxes != room.targets
        assert len(room.solution) >= 6
        assert len(solve(room.floor, room.targets, room.boxes, room.player)) == len(room.solution)


def test_board_symbols_and_fingerprint_hash_the_board():
    env = make_env("sokoban")
    task = env.make_task(5, "train")
    board = env.reset(task).observation.text
    assert board.count("X") + board.count("√") == int(task.task_type[-1])
    assert board.count("P") + board.count("S") == 1 and board.splitlines()[0] == "# # # # # # #"
    same_board = env.make_task(5, "panel-default")  # another task id, the same generated room
    assert env.fingerprint(task) == env.fingerprint(same_board) != env.fingerprint(env.make_task(6, "train"))


def test_expert_replans_after_a_detour():
    env = make_env("sokoban")
    env.reset(env.make_task(9, "train"))
    for move in ("up", "left", "down", "right"):
        env.step(move)
    while True:
        outcome = env.step(env.expert_action())
        if outcome.done:
            break
    assert outcome.won
