"""Playing and timing envs by name: the functions behind `slea play` and `slea bench envs`.

Both return JSON-serialisable dicts. Env step throughput counts only time inside env.step()
(and env.reset() for resets), so a slow expert planner does not make an env look slow.
"""

from __future__ import annotations

import random
import re
import time
from collections import defaultdict
from typing import Any

from actors.envs.base import EnvObservation, EnvTask, TextEnv
from actors.envs.registry import builtin_env_names, make_env
from actors.envs.tasks import TaskSampler, panel_tasks

POLICIES = ("expert", "random")
_SLOT = re.compile(r"<[^<>]*>")  # free-text slot in an admissible action, e.g. search[<your query>]
_WORD = re.compile(r"[A-Za-z0-9']+")


class EnvUnavailableError(RuntimeError):
    """An env whose module cannot be imported here (e.g. an optional dependency is missing)."""


def load_env(
    env_name: str,
    params: dict[str, Any] | None = None,
    max_steps: int | None = None,
    plugins: dict[str, str] | None = None,
) -> TextEnv:
    try:
        return make_env(env_name, params=params, max_steps=max_steps, plugins=plugins)
    except ImportError as error:
        raise EnvUnavailableError(
            f"env '{env_name}' is not available: {error}. Install its dependencies or pick another env."
        ) from error


def random_action(observation: EnvObservation, rng: random.Random) -> str:
    """A uniformly random admissible action; free-text slots get 1-3 words of the observation."""
    words = _WORD.findall(observation.anchor_obs) or ["nothing"]

    def fill(_: re.Match) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))

    if not observation.admissible_actions:  # the env takes any text: answer with words from the page
        return fill(None)
    return _SLOT.sub(fill, rng.choice(observation.admissible_actions))


def _has_expert(env: TextEnv) -> bool:
    return type(env).expert_action is not TextEnv.expert_action


def play(
    env_name: str,
    policy: str = "expert",
    episodes: int = 10,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    max_steps: int | None = None,
    panel: str | None = None,
    plugins: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Play `episodes` episodes of training tasks (or of evaluation panel `panel`) with the expert or random policy.

    Returns success rate, mean reward, mean steps, invalid-action rate and env steps/s, overall and per task type.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy '{policy}'; choose one of {', '.join(POLICIES)}")
    env = load_env(env_name, params, max_steps, plugins)
    if policy == "expert" and not _has_expert(env):
        raise ValueError(f"env '{env_name}' has no expert policy; play it with policy 'random'")
    tasks = panel_tasks(env, panel, size=episodes) if panel else TaskSampler(env, seed)
    rng = random.Random(seed)
    per_type: dict[str, list[dict[str, float]]] = defaultdict(list)
    step_seconds, total_steps, invalid_steps = 0.0, 0, 0
    try:
        for _, task in zip(range(episodes), tasks):
            observation = env.reset(task).observation
            steps, reward, won = 0, 0.0, False
            while True:
                action = env.expert_action() if policy == "expert" else random_action(observation, rng)
                started = time.perf_counter()
                outcome = env.step(action)
                step_seconds += time.perf_counter() - started
                steps += 1
                invalid_steps += not outcome.action_valid
                reward += outcome.reward
                observation, won = outcome.observation, outcome.won
                if outcome.done:
                    break
            per_type[task.task_type].append({"won": float(won), "steps": steps, "reward": reward})
            total_steps += steps
    finally:
        env.close()
    episodes_played = [episode for results in per_type.values() for episode in results]
    summary = _summarise(episodes_played)
    return {
        "env": env_name,
        "policy": policy,
        "episodes": len(episodes_played),
        "seed": seed,
        "panel": panel,
        "max_steps": env.max_steps,
        **summary,
        "invalid_action_rate": round(invalid_steps / max(total_steps, 1), 4),
        "env_steps_per_s": round(total_steps / step_seconds, 1) if step_seconds > 0 else None,
        "by_task_type": {task_type: _summarise(results) for task_type, results in sorted(per_type.items())},
    }


def _summarise(results: list[dict[str, float]]) -> dict[str, Any]:
    count = max(len(results), 1)
    return {
        "success_rate": round(sum(r["won"] for r in results) / count, 4),
        "mean_reward": round(sum(r["reward"] for r in results) / count, 4),
        "mean_steps": round(sum(r["steps"] for r in results) / count, 2),
        "episodes_of_type": len(results),
    }


def bench_env(
    env_name: str,
    resets: int = 50,
    steps: int = 500,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    plugins: dict[str, str] | None = None,
    budget_s: float = 20.0,
) -> dict[str, Any]:
    """Reset and step throughput of one env under a random admissible policy.

    Tasks come straight from make_task (no fingerprinting), so envs that cache generated games
    pay for generation inside the timed reset. Each phase stops early after budget_s / 2 seconds of wall time,
    so one slow env cannot stall a benchmark of all of them; the counts say what was measured.
    """
    started = time.perf_counter()
    env = load_env(env_name, params, plugins=plugins)
    construct_s = time.perf_counter() - started  # includes building shared data (catalogue, index) once
    rng = random.Random(seed)

    def fresh_task() -> EnvTask:
        return env.make_task(rng.getrandbits(31), split="train")

    try:
        reset_seconds, resets_done, phase_started = 0.0, 0, time.perf_counter()
        while resets_done < resets and time.perf_counter() - phase_started < budget_s / 2:
            task = fresh_task()
            started = time.perf_counter()
            observation = env.reset(task).observation
            reset_seconds += time.perf_counter() - started
            resets_done += 1
        step_seconds, steps_done, phase_started = 0.0, 0, time.perf_counter()
        while steps_done < steps and time.perf_counter() - phase_started < budget_s / 2:
            action = random_action(observation, rng)
            started = time.perf_counter()
            outcome = env.step(action)
            step_seconds += time.perf_counter() - started
            steps_done += 1
            observation = outcome.observation if not outcome.done else env.reset(fresh_task()).observation
    finally:
        env.close()
    return {
        "construct_s": round(construct_s, 4),
        "resets": resets_done,
        "resets_per_s": round(resets_done / reset_seconds, 1),
        "steps": steps_done,
        "steps_per_s": round(steps_done / step_seconds, 1),
    }


def bench_envs(
    names: list[str] | None = None,
    resets: int = 50,
    steps: int = 500,
    seed: int = 0,
    params_by_env: dict[str, dict[str, Any]] | None = None,
    plugins: dict[str, str] | None = None,
    budget_s: float = 20.0,
) -> dict[str, Any]:
    """bench_env for each env (default: every built-in); an env that cannot be imported is reported as skipped."""
    results: dict[str, Any] = {}
    for name in names or builtin_env_names():
        try:
            results[name] = bench_env(name, resets, steps, seed, (params_by_env or {}).get(name), plugins, budget_s)
        except EnvUnavailableError as error:
            results[name] = {"skipped": str(error)}
    return {"seed": seed, "envs": results}
