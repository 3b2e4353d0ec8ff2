"""A full Redis (maxmemory, noeviction) refuses every write with OOM; each of the system's writes,
not only the step stream's XADD, turns that into a RedisBackpressure that names the write and what
to do, instead of a raw OOM reply or a retry loop."""

import pytest
import redis
from helpers import fill_redis

from learner.weights import VersionRecord
from library.sync import Publisher
from slea.redis_conn import RedisBackpressure, with_reconnect
from slea.streams import PAYLOAD_FIELD, StreamConsumer

STREAM, DEAD = "slea:full:steps", "slea:full:dead"


@pytest.fixture
def full_redis(redis_client):
    """The server over its maxmemory (set below what it uses), a junk entry waiting in the stream."""
    redis_client.xadd(STREAM, {PAYLOAD_FIELD: b"not msgpack"})
    fill_redis(redis_client)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            redis_client.set("ballast", b"x")
        yield redis_client
    finally:
        redis_client.config_set("maxmemory", 0)


def test_the_policy_version_record(full_redis):
    with pytest.raises(RedisBackpressure, match=r"Redis is full .* refused the policy version record.*runbook"):
        VersionRecord(full_redis, "full").record(7)


def test_the_librarys_replicated_state(full_redis):
    with pytest.raises(RedisBackpressure, match="refused the library's deltas or snapshot"):
        Publisher(full_redis, "full").publish_snapshot('{"items": []}')


def test_a_dead_letter(full_redis):
    full_redis.config_set("maxmemory", 0)  # room for the group to be created, then full again
    reader = StreamConsumer(full_redis, STREAM, group="learner", consumer="l0", dead_letter_key=DEAD)
    fill_redis(full_redis)
    with pytest.raises(RedisBackpressure, match=f"refused a dead letter from {STREAM}"):
        reader.read(count=10, block_ms=10)
    assert full_redis.xpending(STREAM, "learner")["pending"] == 1, "the junk entry stays pending, not lost"


def test_a_full_redis_is_not_retried_as_an_outage(full_redis):
    calls = []

    def write():
        calls.append(1)
        return full_redis.set("slea:full:x", b"y")

    with pytest.raises(RedisBackpressure, match="refused the actor's in-flight episode list"):
        with_reconnect(write, max_wait_s=5.0, what="the actor's in-flight episode list")
    assert calls == [1]
