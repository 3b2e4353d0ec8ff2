"""Optimal Sokoban solutions by breadth-first search over (player, boxes) states.

Exhaustive, so it is meant for the small rooms the env generates (a few thousand states);
`max_states` bounds the work on anything larger."""

from __future__ import annotations

from collections import deque

from actors.envs.sokoban.rules import DIRECTIONS, Cell, step_in


def solve(
    floor: frozenset[Cell], targets: frozenset[Cell], boxes: frozenset[Cell], player: Cell, max_states: int = 200_000
) -> list[str] | None:
    """Shortest move list that puts every box on a target; None when unsolvable (or too big to search)."""
    start = (player, boxes)
    parent: dict[tuple[Cell, frozenset[Cell]], tuple[tuple[Cell, frozenset[Cell]], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if state[1] == targets:
            moves = []
            while parent[state] is not None:
                state, move = parent[state]
                moves.append(move)
            return moves[::-1]
        for move in DIRECTIONS:
            following = step_in(floor, state[1], state[0], move)
            if following not in parent:
                parent[following] = (state, move)
                if len(parent) > max_states:
                    return None
                queue.append(following)
    return None
