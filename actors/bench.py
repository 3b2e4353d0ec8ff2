"""`slea bench actors`: an actor worker's throughput against its bare engine, in the same run.

One worker (the local default model on the transformers engine, alfworld easy) plays whole
groups into a private Redis stream. Then the same engine regenerates exactly the prompts the
worker recorded, in batches of the same size, with no pool around it. `overhead_fraction` is
the share of the worker's wall time spent in our own code on the event loop (prompt building,
record assembly, msgpack encoding, XADD, retrieval calls): what the pool costs on top of
generation and env.step.
"""

from __future__ import annotations

import asyncio
import time

import redis

from actors.engines import SamplingSettings
from actors.engines.transformers_engine import TransformersEngine
from actors.worker import ActorWorker
from slea.config import load_config
from slea.embedded_redis import EmbeddedRedis
from slea.models import load_model
from slea.records import decode
from slea.streams import PAYLOAD_FIELD


def bench_actors(
    groups: int = 2,
    group_size: int = 4,
    max_new_tokens: int = 32,
    model: str = "smollm2-135m-instruct",
    env: str = "alfworld",
) -> dict:
    config = load_config(
        None,
        [
            "run.id=bench-actors",
            f"model.name={model}",
            f"model.max_new_tokens={max_new_tokens}",
            f"envs.name={env}",
            "envs.params.difficulty=easy",
            "envs.budgets=[4]",
            "envs.panel_size=4",
            f"actors.group_size={group_size}",
            f"actors.envs_per_worker={group_size}",
            "actors.retrieval_mode=none",
        ],
    )
    policy, tokenizer = load_model(config.model.name, config.model.dtype)
    sampling = SamplingSettings(
        temperature=config.model.temperature, top_p=config.model.top_p, max_new_tokens=config.model.max_new_tokens
    )
    engine = TransformersEngine(policy, tokenizer, sampling, max_batch=group_size)
    with EmbeddedRedis(appendonly=False) as server:
        client = redis.Redis.from_url(server.url)
        worker = ActorWorker(config, 0, client, engine)
        started = time.perf_counter()
        stats = asyncio.run(worker.run(max_groups=groups))
        wall = time.perf_counter() - started
        prompts = [list(decode(fields[PAYLOAD_FIELD]).prompt_ids) for _id, fields in client.xrange(config.stream_key())]
    raw_started = time.perf_counter()
    raw_tokens = sum(
        len(g.response_ids)
        for start in range(0, len(prompts), group_size)
        for g in engine.generate_batch(prompts[start : start + group_size])
    )
    raw_wall = time.perf_counter() - raw_started
    timers = stats.timers
    return {
        "tokens_per_s": round(timers.tokens / wall, 2),
        "env_steps_per_s": round(timers.steps / wall, 3),
        "raw_engine_tokens_per_s": round(raw_tokens / raw_wall, 2),
        "overhead_fraction": round(timers.overhead_s / wall, 4),
        "env_time_fraction": round(timers.env_s / wall, 4),
        "steps": timers.steps,
        "episodes": stats.episodes_finished,
        "wall_s": round(wall, 1),
        "raw_wall_s": round(raw_wall, 1),
        "model": model,
        "env": env,
        "retrieval": "off (no library in this benchmark)",
    }
