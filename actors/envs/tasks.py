"""Seeded task sampling and fixed evaluation panels.

A panel is a named list of tasks derived only from (env, panel name, params), so it is the
same on every machine; the training sampler skips any task whose content fingerprint is in a
panel, so held-out evaluation really is held out.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from actors.envs.base import EnvTask, TextEnv

DEFAULT_PANEL_SIZE = 60


def _panel_seed(env_name: str, panel: str, index: int) -> int:
    digest = hashlib.sha256(f"{env_name}/{panel}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF


def panel_tasks(env: TextEnv, panel: str = "default", size: int = DEFAULT_PANEL_SIZE) -> list[EnvTask]:
    """The evaluation panel `panel` of this env: `size` tasks, identical on every machine."""
    tasks, seen = [], set()
    index = 0
    while len(tasks) < size:
        task = env.make_task(_panel_seed(env.name, panel, index), split=f"panel-{panel}")
        index += 1
        fingerprint = env.fingerprint(task)
        if fingerprint not in seen:  # small task spaces can repeat a game; a panel lists each once
            seen.add(fingerprint)
            tasks.append(task)
        if index > size * 50:
            break  # the env has fewer distinct tasks than asked for
    return tasks


class TaskSampler:
    """Infinite seeded stream of training tasks, disjoint from the given panels."""

    def __init__(self, env: TextEnv, seed: int, held_out: list[EnvTask] = ()):
        self.env = env
        self.rng = random.Random(seed)
        self.held_out = {env.fingerprint(task) for task in held_out}

    def __iter__(self) -> Iterator[EnvTask]:
        return self

    def __next__(self) -> EnvTask:
        for _ in range(10_000):
            task = self.env.make_task(self.rng.getrandbits(31), split="train")
            if self.env.fingerprint(task) not in self.held_out:
                return task
        raise RuntimeError(f"{self.env.name}: every sampled task is in the evaluation panel; enlarge the task space")
