"""Sokoban's movement rule, shared by the generator, the solver and the env."""

from __future__ import annotations

Cell = tuple[int, int]  # (row, column)
DIRECTIONS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def step_in(floor: frozenset[Cell], boxes: frozenset[Cell], player: Cell, move: str) -> tuple[Cell, frozenset[Cell]]:
    """Walk, or push one box if the cell behind it is free; blocked moves change nothing."""
    d_row, d_col = DIRECTIONS[move]
    ahead = (player[0] + d_row, player[1] + d_col)
    if ahead not in floor:
        return player, boxes
    if ahead in boxes:
        beyond = (ahead[0] + d_row, ahead[1] + d_col)
        if beyond not in floor or beyond in boxes:
            return player, boxes
        return ahead, (boxes - {ahead}) | {beyond}
    return ahead, boxes
