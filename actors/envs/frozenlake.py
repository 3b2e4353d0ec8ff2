"""FrozenLake on gymnasium's own engine (FrozenLakeEnv over generate_random_map), shown as a
text board with the player marked, as verl-agent's text FrozenLake does."""

from __future__ import annotations

import hashlib
import random
from collections import deque
from typing import Any

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv
from actors.envs.registry import register_env

ACTIONS = ("left", "down", "right", "up")  # index = gymnasium's action id
_MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_SYMBOLS = {"S": "_", "F": "_", "H": "O", "G": "G"}
NOTHING_HAPPENS = "Nothing happens."


def _lake_params(params: dict[str, Any]) -> tuple[tuple[int, ...], float, bool]:
    sizes = tuple(int(size) for size in params.get("sizes", (4, 6)))
    return sizes, float(params.get("frozen_probability", 0.8)), bool(params.get("is_slippery", False))


def _lake_map(task: EnvTask) -> list[str]:
    size = int(task.task_type.removeprefix("lake_").split("x")[0])
    _, frozen_probability, _ = _lake_params(task.params)
    return generate_random_map(size=size, p=frozen_probability, seed=task.seed)


@register_env("frozenlake")
class FrozenLakeTextEnv(TextEnv):
    """Params: sizes (board sides to draw from, default [4, 6]), frozen_probability (0.8), is_slippery (False)."""

    default_max_steps = 20

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        super().__init__(params, max_steps)
        self.lake: FrozenLakeEnv | None = None
        self.desc: list[str] = []
        self.position = 0  # gymnasium state: row * size + column
        self.steps_taken = 0
        self.done = False

    def task_types(self) -> list[str]:
        return [f"lake_{size}x{size}" for size in _lake_params(self.params)[0]]

    def make_task(self, seed: int, split: str) -> EnvTask:
        size = random.Random(seed).choice(_lake_params(self.params)[0])
        return EnvTask(
            env_name=self.name,
            task_id=f"{self.name}/{split}/{seed}",
            task_type=f"lake_{size}x{size}",
            seed=seed,
            params=dict(self.params),
        )

    def fingerprint(self, task: EnvTask) -> str:
        # A 4x4 lake has few layouts: many seeds draw the same board.
        slippery = _lake_params(task.params)[2]
        board = "\n".join(_lake_map(task)) + f"\nslippery={slippery}"
        return f"{task.task_type}:{hashlib.sha256(board.encode()).hexdigest()[:16]}"

    def reset(self, task: EnvTask) -> ResetOutcome:
        self.desc = _lake_map(task)
        self.lake = FrozenLakeEnv(desc=self.desc, is_slippery=_lake_params(task.params)[2])
        self.position, _ = self.lake.reset(seed=task.seed)
        self.steps_taken = 0
        self.done = False
        slippery = " The ice is slippery: you may slide sideways." if _lake_params(task.params)[2] else ""
        task_text = (
            "You are on a frozen lake. Walk to the goal G without falling into a hole O. "
            f"P is you, _ is safe ice.{slippery} Move with left, down, right or up."
        )
        return ResetOutcome(observation=self._observe(), task_text=task_text, task_type=task.task_type)

    def step(self, action: str | None) -> StepOutcome:
        if self.lake is None:
            raise RuntimeError("FrozenLakeTextEnv.step() before reset(): reset the env with a task first")
        if self.done:
            return StepOutcome(
                self._observe(NOTHING_HAPPENS), 0.0, True, False, False, {"error": "episode is over; reset the env"}
            )
        self.steps_taken += 1
        move = (action or "").strip().lower()
        valid = move in ACTIONS
        reward, won, fell = 0.0, False, False
        if valid:
            self.position, reward, terminated, _, _ = self.lake.step(ACTIONS.index(move))
            won = reward > 0
            fell = terminated and not won
        self.done = won or fell or self.steps_taken >= self.max_steps
        return StepOutcome(
            self._observe("" if valid else NOTHING_HAPPENS),
            float(reward),
            self.done,
            won,
            valid,
            {"fell_in_hole": fell},
        )

    def expert_action(self) -> str | None:
        """First move of a shortest safe path (BFS); re-planned every step, so it copes with slipping."""
        if self.lake is None or self.done:
            return None
        size = len(self.desc)
        start = divmod(self.position, size)
        parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if self.desc[cell[0]][cell[1]] == "G":
                while parent[cell] is not None and parent[cell][0] != start:
                    cell = parent[cell][0]
                return parent[cell][1] if parent[cell] else None
            for move, (d_row, d_col) in _MOVES.items():
                row, col = cell[0] + d_row, cell[1] + d_col
                if 0 <= row < size and 0 <= col < size and (row, col) not in parent and self.desc[row][col] != "H":
                    parent[(row, col)] = (cell, move)
                    queue.append((row, col))
        return None

    def board_text(self) -> str:
        size = len(self.desc)
        player_row, player_col = divmod(self.position, size)
        rows = []
        for row in range(size):
            cells = [_SYMBOLS[cell] for cell in self.desc[row]]
            on_hole = self.desc[player_row][player_col] == "H"
            if row == player_row:
                cells[player_col] = "X" if on_hole else "P"
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def _observe(self, prefix: str = "") -> EnvObservation:
        board = self.board_text()
        return EnvObservation(
            text=f"{prefix}\n{board}" if prefix else board,
            anchor_obs=board,
            admissible_actions=[] if self.done else list(ACTIONS),
        )
