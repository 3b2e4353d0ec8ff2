"""Text Sokoban: push every box onto a target in a generated room; reward 1 when solved."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv
from actors.envs.registry import register_env
from actors.envs.sokoban.room import Room, generate_room
from actors.envs.sokoban.rules import DIRECTIONS, Cell, step_in
from actors.envs.sokoban.solver import solve

ACTIONS = tuple(DIRECTIONS)  # up, down, left, right
NOTHING_HAPPENS = "Nothing happens."
TASK_TEXT = (
    "Push every box (X) onto a target (O). # is a wall, _ is floor, √ is a box on a target, "
    "P is you (S when you stand on a target). Boxes can be pushed, not pulled. Move with up, down, left or right."
)


def room_of(task: EnvTask) -> Room:
    """The generated room of a task; params: size (side incl. walls, default 7), max_walk (30), min_solution_moves (6)."""
    size = int(task.params.get("size", 7))
    return generate_room(
        task.seed,
        size,
        size,
        int(task.task_type.removeprefix("boxes_")),
        int(task.params.get("max_walk", 30)),
        int(task.params.get("min_solution_moves", 6)),
    )


def render_board(room: Room, boxes: frozenset[Cell], player: Cell) -> str:
    rows = []
    for row in range(room.height):
        cells = []
        for col in range(room.width):
            cell = (row, col)
            if cell == player:
                cells.append("S" if cell in room.targets else "P")
            elif cell in boxes:
                cells.append("√" if cell in room.targets else "X")
            elif cell in room.targets:
                cells.append("O")
            else:
                cells.append("_" if cell in room.floor else "#")
        rows.append(" ".join(cells))
    return "\n".join(rows)


@register_env("sokoban")
class SokobanEnv(TextEnv):
    """Params: box_counts (default [1, 2], one task type each), size, max_walk, min_solution_moves (see room_of)."""

    default_max_steps = 30

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        super().__init__(params, max_steps)
        self.room: Room | None = None
        self.boxes: frozenset[Cell] = frozenset()
        self.player: Cell = (0, 0)
        self.plan: list[str] = []  # expert moves left, valid from (plan_from) onwards
        self.plan_from: tuple[Cell, frozenset[Cell]] | None = None
        self.steps_taken = 0
        self.done = False

    def task_types(self) -> list[str]:
        return [f"boxes_{count}" for count in self.params.get("box_counts", (1, 2))]

    def make_task(self, seed: int, split: str) -> EnvTask:
        task_type = random.Random(seed).choice(self.task_types())
        return EnvTask(
            env_name=self.name,
            task_id=f"{self.name}/{split}/{seed}",
            task_type=task_type,
            seed=seed,
            params=dict(self.params),
        )

    def fingerprint(self, task: EnvTask) -> str:
        # Small rooms repeat across seeds: the board is the task.
        room = room_of(task)
        board = render_board(room, room.boxes, room.player)
        return f"{task.task_type}:{hashlib.sha256(board.encode()).hexdigest()[:16]}"

    def reset(self, task: EnvTask) -> ResetOutcome:
        self.room = room_of(task)
        self.boxes, self.player = self.room.boxes, self.room.player
        self.plan, self.plan_from = list(self.room.solution), (self.player, self.boxes)
        self.steps_taken = 0
        self.done = False
        return ResetOutcome(observation=self._observe(), task_text=TASK_TEXT, task_type=task.task_type)

    def step(self, action: str | None) -> StepOutcome:
        if self.room is None:
            raise RuntimeError("SokobanEnv.step() before reset(): reset the env with a task first")
        if self.done:
            return StepOutcome(
                self._observe(NOTHING_HAPPENS), 0.0, True, False, False, {"error": "episode is over; reset the env"}
            )
        self.steps_taken += 1
        move = (action or "").strip().lower()
        valid = move in ACTIONS
        if valid:
            self.player, self.boxes = step_in(self.room.floor, self.boxes, self.player, move)
        won = self.boxes == self.room.targets
        self.done = won or self.steps_taken >= self.max_steps
        info = {"boxes_on_target": len(self.boxes & self.room.targets)}
        return StepOutcome(
            self._observe("" if valid else NOTHING_HAPPENS), 1.0 if won else 0.0, self.done, won, valid, info
        )

    def expert_action(self) -> str | None:
        """Next move of an optimal solution (BFS), re-solved if play left the planned path."""
        if self.room is None or self.done:
            return None
        state = (self.player, self.boxes)
        if state != self.plan_from or not self.plan:
            self.plan, self.plan_from = solve(self.room.floor, self.room.targets, self.boxes, self.player) or [], state
        if not self.plan:
            return None  # a box is stuck: no solution from here
        move = self.plan.pop(0)
        self.plan_from = step_in(self.room.floor, self.boxes, self.player, move)
        return move

    def _observe(self, prefix: str = "") -> EnvObservation:
        board = render_board(self.room, self.boxes, self.player)
        return EnvObservation(
            text=f"{prefix}\n{board}" if prefix else board,
            anchor_obs=board,
            admissible_actions=[] if self.done else list(ACTIONS),
        )
