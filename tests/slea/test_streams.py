"""The step stream against a real redis-server: delivery, claiming, dead letters, trimming, restarts."""

import multiprocessing as mp
import os
import threading
import time

import numpy as np
import redis

from slea.records import StepRecord
from slea.stream_admin import group_stats, trim_acknowledged
from slea.streams import PAYLOAD_FIELD, StreamConsumer, StreamProducer

STREAM, DEAD = "slea:test:steps", "slea:test:dead"


def make_records(count: int, episode: str = "ep", start: int = 0) -> list[StepRecord]:
    return [
        StepRecord(
            "test",
            "task",
            "pick",
            "alfworld",
            "group",
            f"{episode}-{(start + i) // 10}",
            (start + i) % 10,
            "obs",
            prompt_ids=np.arange(20, dtype=np.int32),
            response_ids=np.arange(3, dtype=np.int32),
            response_logprobs=np.full(3, -0.5, dtype=np.float32),
        )
        for i in range(count)
    ]


def consumer(client, group, name, **options) -> StreamConsumer:
    return StreamConsumer(client, STREAM, group=group, consumer=name, dead_letter_key=DEAD, **options)


def drain(reader: StreamConsumer, applied: dict, *, ack: bool = True, rounds: int = 50) -> int:
    """Read until nothing comes back; apply idempotently by (episode_id, step)."""
    total = 0
    for _ in range(rounds):
        deliveries = reader.read(count=64, block_ms=50)
        if not deliveries:
            break
        for delivery in deliveries:
            applied[delivery.record.key()] = applied.get(delivery.record.key(), 0) + 1
        if ack:
            reader.ack([delivery.entry_id for delivery in deliveries])
        total += len(deliveries)
    return total


def test_two_groups_each_see_every_record(redis_client):
    learner, library = consumer(redis_client, "learner", "l0"), consumer(redis_client, "library", "b0")
    records = make_records(300)
    ids = StreamProducer(redis_client, STREAM, batch_size=32).send(records)
    assert len(ids) == 300 and len(set(ids)) == 300
    for reader in (learner, library):
        applied = {}
        assert drain(reader, applied) == 300
        assert set(applied) == {record.key() for record in records}
    stats = group_stats(redis_client, STREAM)
    assert stats["learner"].pending == 0 and stats["library"].lag == 0


def _read_apply_and_die(url: str, count: int) -> None:
    """A consumer process that reads, makes its effect durable, and is killed before it acks."""
    client = redis.Redis.from_url(url)
    reader = consumer(client, "learner", "doomed")
    deliveries = reader.read(count=count, block_ms=1000)
    for delivery in deliveries[: count // 2]:  # half the effects landed before the crash
        client.hsetnx("applied", f"{delivery.record.episode_id}/{delivery.record.step}", delivery.entry_id)
    os.kill(os.getpid(), 9)


def test_killed_consumer_entries_are_claimed_and_applied_exactly_once(redis_url, redis_client):
    survivor = consumer(redis_client, "learner", "survivor", claim_idle_ms=300)
    records = make_records(200)
    StreamProducer(redis_client, STREAM).send(records)
    doomed = mp.get_context("spawn").Process(target=_read_apply_and_die, args=(redis_url, 80))
    doomed.start()
    doomed.join(60)
    assert doomed.exitcode == -9
    assert group_stats(redis_client, STREAM)["learner"].pending == 80
    applications = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and redis_client.hlen("applied") < 200:
        deliveries = survivor.read(count=64, block_ms=100)
        for delivery in deliveries:
            applications += redis_client.hsetnx(
                "applied", f"{delivery.record.episode_id}/{delivery.record.step}", delivery.entry_id
            )
        survivor.ack([delivery.entry_id for delivery in deliveries])
        time.sleep(0.05)
    assert redis_client.hlen("applied") == 200  # none lost
    assert applications == 160  # the 40 the dead consumer applied were not applied again
    assert group_stats(redis_client, STREAM)["learner"].pending == 0


def test_poison_entry_is_dead_lettered_and_consumption_continues(redis_client):
    producer = StreamProducer(redis_client, STREAM)
    poison_id = producer.send(make_records(1, episode="poison"))[0]
    garbage_id = redis_client.xadd(STREAM, {PAYLOAD_FIELD: b"\xc1not msgpack"}).decode()
    healthy = producer.send(make_records(5, episode="healthy"))
    processed = set()
    for _crash in range(6):  # the consumer dies on the poison record every time and is restarted
        reader = consumer(redis_client, "learner", "l0", max_deliveries=3)
        for _ in range(3):
            deliveries = reader.read(count=16, block_ms=20)
            good = [d.entry_id for d in deliveries if d.record.episode_id.startswith("healthy")]
            processed.update(good)
            reader.ack(good)
    assert processed == set(healthy)
    dead = {fields[b"source_id"].decode(): fields[b"reason"].decode() for _id, fields in redis_client.xrange(DEAD)}
    assert set(dead) == {poison_id, garbage_id}
    assert dead[garbage_id].startswith("malformed")
    assert "delivered 4 times" in dead[poison_id]  # 3 deliveries allowed; the 4th is refused
    assert group_stats(redis_client, STREAM)["learner"].pending == 0


def test_entries_of_a_dead_consumer_go_to_the_dead_letter_stream_after_max_deliveries(redis_client):
    StreamProducer(redis_client, STREAM).send(make_records(1, episode="poison"))
    crashing = [consumer(redis_client, "learner", f"c{i}", max_deliveries=2, claim_idle_ms=30) for i in range(3)]
    assert len(crashing[0].read(block_ms=10)) == 1  # delivery 1, never acked
    time.sleep(0.05)
    assert len(crashing[1].read(block_ms=10)) == 1  # claimed: delivery 2, never acked
    time.sleep(0.05)
    assert crashing[2].read(block_ms=10) == []  # a third delivery is refused: dead-lettered
    ((_id, fields),) = redis_client.xrange(DEAD)
    assert b"delivered 2 times" in fields[b"reason"]


def test_a_consumer_does_not_reclaim_entries_it_holds(redis_client):
    holder = consumer(redis_client, "learner", "l0", claim_idle_ms=20)
    StreamProducer(redis_client, STREAM).send(make_records(4))
    held = holder.read(count=10, block_ms=10)
    time.sleep(0.05)
    assert holder.read(count=10, block_ms=10) == []  # still held, not redelivered to itself
    holder.ack([d.entry_id for d in held])


def test_entries_pending_again_after_a_lost_xack_are_handed_over_again(redis_client):
    """A Redis crash that loses its AOF's last second undoes the XACKs of that second: the entries are
    pending again under the consumer that acked them, which no longer holds them. reclaim_forgotten
    hands over exactly those (idle past claim_idle_ms, not held, its own), and nothing else."""
    learner = consumer(redis_client, "learner", "l0", claim_idle_ms=20)
    other = consumer(redis_client, "learner", "l1", claim_idle_ms=20)
    StreamProducer(redis_client, STREAM).send(make_records(6))
    delivered = learner.read(count=4, block_ms=10)  # 4 pending under l0
    others = other.read(count=2, block_ms=10)  # 2 pending under l1
    held = {delivered[0].entry_id}  # l0 still holds the first in memory; the other 3 were "acked"
    assert learner.reclaim_forgotten(held) == []  # not idle for claim_idle_ms yet
    time.sleep(0.05)
    again = learner.reclaim_forgotten(held)
    assert [d.entry_id for d in again] == [d.entry_id for d in delivered[1:]]
    assert [d.record for d in again] == [d.record for d in delivered[1:]]
    pending = redis_client.xpending_range(STREAM, "learner", "-", "+", 10)
    assert {(p["message_id"].decode(), p["consumer"].decode()) for p in pending} == {
        *((d.entry_id, "l0") for d in delivered),
        *((d.entry_id, "l1") for d in others),  # another consumer's entries are claim_idle's business
    }
    learner.ack([d.entry_id for d in delivered])
    assert learner.reclaim_forgotten(set()) == []


def test_dead_letter_keeps_the_payload(redis_client):
    reader = consumer(redis_client, "learner", "l0")
    redis_client.xadd(STREAM, {PAYLOAD_FIELD: b"\x93\x01\x02\x03"})
    assert reader.read(block_ms=10) == []
    ((_, fields),) = redis_client.xrange(DEAD)
    assert fields[b"payload"] == b"\x93\x01\x02\x03" and fields[b"group"] == b"learner"


def test_trim_never_deletes_what_a_slow_group_has_not_acked(redis_client):
    fast, slow = consumer(redis_client, "learner", "l0"), consumer(redis_client, "library", "b0")
    ids = StreamProducer(redis_client, STREAM).send(make_records(100))
    drain(fast, {})
    first = slow.read(count=30, block_ms=10)
    slow.ack([d.entry_id for d in first[:20]])  # 20 acked, 10 pending, 70 never delivered
    assert trim_acknowledged(redis_client, STREAM, ["learner", "library"]) == 20
    remaining = [entry_id.decode() for entry_id, _ in redis_client.xrange(STREAM)]
    assert remaining == ids[20:]
    applied = {}
    slow_restarted = consumer(redis_client, "library", "b0")  # restart: pending first, then new
    assert drain(slow_restarted, applied) == 80
    assert trim_acknowledged(redis_client, STREAM, ["learner", "library"]) == 80
    assert redis_client.xlen(STREAM) == 0


def test_trim_refuses_while_a_required_group_is_missing(redis_client):
    learner = consumer(redis_client, "learner", "l0")
    StreamProducer(redis_client, STREAM).send(make_records(10))
    drain(learner, {})
    assert trim_acknowledged(redis_client, STREAM, ["learner", "library"]) == 0
    assert redis_client.xlen(STREAM) == 10


def test_restarted_consumer_reads_its_pending_entries_first(redis_client):
    first = consumer(redis_client, "learner", "l0")
    StreamProducer(redis_client, STREAM).send(make_records(30))
    unacked = first.read(count=10, block_ms=10)
    restarted = consumer(redis_client, "learner", "l0")
    again = restarted.read(count=64, block_ms=10)
    assert [d.entry_id for d in again] == [d.entry_id for d in unacked]
    restarted.ack([d.entry_id for d in again])
    assert len(restarted.read(count=64, block_ms=10)) == 20


def test_redis_restart_during_production_loses_nothing_acknowledged(redis_server, redis_url):
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=1)
    producer = StreamProducer(client, STREAM, batch_size=20)
    reader = consumer(redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=1), "learner", "l0")
    produced_keys, applied, stop = [], {}, threading.Event()

    def produce():
        for batch in range(60):
            records = make_records(20, episode="restart", start=batch * 20)
            producer.send(records)
            produced_keys.extend(record.key() for record in records)
            time.sleep(0.01)
        stop.set()

    def consume():
        while not (stop.is_set() and drain(reader, applied) == 0):
            drain(reader, applied, rounds=1)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    redis_server.restart()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert len(produced_keys) == 1200
    assert set(produced_keys) <= set(applied)  # every produced step arrived; redelivery only adds repeats
    assert group_stats(client, STREAM)["learner"].pending == 0


def test_transport_metrics_count_what_happened(redis_client):
    from prometheus_client import REGISTRY

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "produced": sample("slea_stream_records_produced_total", stream=STREAM),
        "acked": sample("slea_stream_records_acked_total", stream=STREAM, group="learner"),
        "dead": sample("slea_stream_dead_lettered_total", stream=STREAM, group="learner", reason="malformed"),
    }
    reader = consumer(redis_client, "learner", "l0")
    StreamProducer(redis_client, STREAM).send(make_records(12))
    redis_client.xadd(STREAM, {PAYLOAD_FIELD: b"junk"})
    drain(reader, {})
    group_stats(redis_client, STREAM)
    assert sample("slea_stream_records_produced_total", stream=STREAM) - before["produced"] == 12
    assert sample("slea_stream_records_acked_total", stream=STREAM, group="learner") - before["acked"] == 12
    assert (
        sample("slea_stream_dead_lettered_total", stream=STREAM, group="learner", reason="malformed") - before["dead"]
        == 1
    )
    assert sample("slea_stream_lag", stream=STREAM, group="learner") == 0
    assert sample("slea_stream_bytes_produced_total", stream=STREAM) > 12 * 100


def test_auth_password_comes_from_env_or_file(redis_client, redis_url, tmp_path, monkeypatch):
    import pytest

    from slea.config import RedisConfig
    from slea.redis_conn import connect

    redis_client.config_set("requirepass", "s3cret")
    try:
        with pytest.raises(redis.AuthenticationError):
            connect(RedisConfig(password_env="SLEA_TEST_UNSET_PASSWORD"), redis_url).ping()
        monkeypatch.setenv("SLEA_TEST_PASSWORD", "s3cret")
        assert connect(RedisConfig(password_env="SLEA_TEST_PASSWORD"), redis_url).ping()
        secret = tmp_path / "password"
        secret.write_text("s3cret\n")
        assert connect(RedisConfig(password_file=str(secret)), redis_url).ping()
    finally:
        authed = redis.Redis.from_url(redis_url, password="s3cret")
        authed.config_set("requirepass", "")


def test_a_full_redis_gives_producers_a_backpressure_error_not_an_oom(redis_client):
    """maxmemory with noeviction: XADD is refused with OOM, which the producer turns into a
    RedisBackpressure that says what to do, and counts (SleaStreamBackpressure alerts on it)."""
    import pytest
    from prometheus_client import REGISTRY

    from slea.redis_conn import RedisBackpressure

    before = REGISTRY.get_sample_value("slea_stream_backpressure_total", {"stream": STREAM}) or 0.0
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", redis_client.info("memory")["used_memory"] + 2 * 1024 * 1024)
    try:
        producer = StreamProducer(redis_client, STREAM, batch_size=64)
        with pytest.raises(
            RedisBackpressure, match=r"Redis is full \(maxmemory reached, policy noeviction\).*consumer"
        ):
            for _ in range(1000):  # ~2 MB of records fill it long before this ends
                producer.send(make_records(64))
        assert REGISTRY.get_sample_value("slea_stream_backpressure_total", {"stream": STREAM}) - before == 1
        assert redis_client.ping()  # Redis itself is fine and still answers reads
        assert redis_client.xlen(STREAM) > 0
    finally:
        redis_client.config_set("maxmemory", 0)


def test_the_dead_letter_stream_is_bounded(redis_client):
    for index in range(30):
        redis_client.xadd(STREAM, {PAYLOAD_FIELD: f"junk {index}".encode()})
    reader = consumer(redis_client, "learner", "l0", dead_letter_maxlen=10)
    drain(reader, {})
    dead = redis_client.xrange(DEAD)
    assert len(dead) == 10  # the newest ten dead letters, trimmed exactly
    assert dead[-1][1][b"payload"] == b"junk 29"
