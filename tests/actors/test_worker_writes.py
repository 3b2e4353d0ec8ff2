"""An actor worker's writes against a real Redis that fills up (maxmemory, noeviction): every step
played is in the stream or counted lost (slea_actor_steps_lost_total and an error line), never
dropped silently; a group task that fails ends the worker's loop loudly (actors/outbox.py)."""

import asyncio
import logging

import pytest
from helpers import FixedEngine, fill_redis
from prometheus_client import REGISTRY

from actors.outbox import StepsLost
from actors.worker import ActorWorker
from slea.config import SleaConfig
from slea.records import decode
from slea.streams import PAYLOAD_FIELD


class FillingEngine(FixedEngine):
    """Fills Redis before its `at`-th generation and frees it `free_after_s` later (None: never)."""

    def __init__(self, client, at: int, free_after_s: float | None):
        super().__init__()
        self.client, self.at, self.free_after_s = client, at, free_after_s

    async def generate(self, prompt_ids):
        if len(self.prompts) + 1 == self.at:
            fill_redis(self.client)
            if self.free_after_s is not None:
                asyncio.get_running_loop().call_later(self.free_after_s, self.client.config_set, "maxmemory", 0)
        return await super().generate(prompt_ids)


class BrokenEngine(FixedEngine):
    """Raises from its 6th generation on, until repaired."""

    repaired = False

    async def generate(self, prompt_ids):
        if len(self.prompts) == 5 and not self.repaired:
            raise RuntimeError("the engine broke")
        return await super().generate(prompt_ids)


def worker_config(reconnect_max_s: float) -> SleaConfig:
    config = SleaConfig()
    config.run.id = "writes"
    config.envs.name, config.envs.panel_size, config.envs.max_steps = "frozenlake", 2, 3
    config.actors.group_size, config.actors.envs_per_worker = 2, 2
    config.redis.reconnect_max_s = reconnect_max_s
    return config


def steps_in_stream(client, config) -> list:
    records = [decode(fields[PAYLOAD_FIELD]) for _id, fields in client.xrange(config.stream_key())]
    return [record for record in records if not record.abandoned]


def lost(reason: str) -> float:
    return REGISTRY.get_sample_value("slea_actor_steps_lost_total", {"worker": "0", "reason": reason}) or 0.0


def test_a_full_redis_holds_the_steps_until_it_has_room(redis_client):
    config = worker_config(reconnect_max_s=30)
    worker = ActorWorker(config, 0, redis_client, FillingEngine(redis_client, at=4, free_after_s=1.0))
    try:
        stats = asyncio.run(worker.run(max_groups=4))
    finally:
        redis_client.config_set("maxmemory", 0)
    steps = steps_in_stream(redis_client, config)
    assert len(steps) == stats.timers.steps and stats.episodes_finished == 8, "a step played was not written"
    episodes = {}
    for record in steps:
        episodes.setdefault(record.episode_id, []).append(record.step)
    assert all(sorted(held) == list(range(len(held))) for held in episodes.values()), "an episode has a gap"


def test_steps_redis_refuses_past_the_window_are_counted_lost_and_the_loop_fails(redis_client, caplog):
    config = worker_config(reconnect_max_s=1.0)
    worker = ActorWorker(config, 0, redis_client, FillingEngine(redis_client, at=4, free_after_s=None))
    before = lost("redis_full")
    try:
        with caplog.at_level(logging.ERROR), pytest.raises(StepsLost, match="steps of .* episodes lost"):
            asyncio.run(worker.run(max_groups=4))
    finally:
        redis_client.config_set("maxmemory", 0)
    counted = lost("redis_full") - before
    assert counted > 0 and len(steps_in_stream(redis_client, config)) + counted == worker.stats.timers.steps
    assert f"{int(counted)} steps of" in caplog.text, "the log names the steps lost"
    # The loop started again (the pool's supervise) marks the episodes it had in flight abandoned first.
    asyncio.run(worker.run(max_groups=worker.stats.groups_started + 1))
    records = [decode(fields[PAYLOAD_FIELD]) for _id, fields in redis_client.xrange(config.stream_key())]
    complete = {r.episode_id for r in records if r.done and not r.abandoned}
    abandoned = {r.episode_id for r in records if r.abandoned}
    assert abandoned, "the episodes whose steps were lost were not marked abandoned"
    assert {r.episode_id for r in records} - complete <= abandoned, "an episode with a gap is unmarked"


def test_a_failing_group_task_ends_the_loop_loudly(redis_client):
    worker = ActorWorker(worker_config(reconnect_max_s=30), 0, redis_client, BrokenEngine())
    with pytest.raises(RuntimeError, match="the engine broke"):
        asyncio.run(worker.run(max_groups=6))
    worker.engine.repaired = True  # the loop started again plays on, with no group of the failed one in play
    finished = worker.stats.episodes_finished
    asyncio.run(worker.run(max_groups=worker.stats.groups_started + 2))
    assert worker.stats.episodes_finished == finished + 4
