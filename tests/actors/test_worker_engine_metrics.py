"""The engine's phase seconds and prompt tokens reach a worker's summary (the run's time line) and its
Prometheus counters exactly, however many episodes share the engine at once."""

import asyncio
import dataclasses

from helpers import FixedEngine
from prometheus_client import REGISTRY

from actors.worker import ActorWorker
from slea.config import SleaConfig

PREFILL_S, DECODE_S, CACHED = 0.25, 0.5, 3  # what the engine says of every generation


class TimedEngine(FixedEngine):
    async def generate(self, prompt_ids):
        generation = await super().generate(prompt_ids)
        return dataclasses.replace(generation, prefill_s=PREFILL_S, decode_s=DECODE_S, cached_prompt_tokens=CACHED)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"slea_{name}", {"worker": "7", **labels}) or 0.0


def test_every_generations_phases_and_prompt_tokens_are_counted_once(redis_client):
    config = SleaConfig()
    config.run.id = "engine-metrics"
    config.envs.name, config.envs.panel_size, config.envs.max_steps = "frozenlake", 2, 3
    config.actors.group_size, config.actors.envs_per_worker = 2, 2
    engine = TimedEngine()
    before = {
        "prefill": counter("actor_engine_seconds_total", phase="prefill"),
        "decode": counter("actor_engine_seconds_total", phase="decode"),
        "prompt": counter("actor_prompt_tokens_total"),
        "cached": counter("actor_cached_prompt_tokens_total"),
    }
    stats = asyncio.run(ActorWorker(config, 7, redis_client, engine).run(max_groups=3))
    steps, prompt_tokens = len(engine.prompts), sum(len(prompt) for prompt in engine.prompts)
    assert steps == stats.timers.steps > 0
    timers = stats.timers
    assert (timers.prefill_s, timers.decode_s) == (steps * PREFILL_S, steps * DECODE_S)
    assert (timers.prompt_tokens, timers.cached_prompt_tokens) == (prompt_tokens, steps * CACHED)
    assert counter("actor_engine_seconds_total", phase="prefill") - before["prefill"] == steps * PREFILL_S
    assert counter("actor_engine_seconds_total", phase="decode") - before["decode"] == steps * DECODE_S
    assert counter("actor_prompt_tokens_total") - before["prompt"] == prompt_tokens
    assert counter("actor_cached_prompt_tokens_total") - before["cached"] == steps * CACHED
