"""`slea bench stream`: StepRecord throughput against raw Redis Streams in the same run.

Both legs use the same topology on the same private Redis: `producers` processes XADD in
pipelined batches while two consumer groups (learner, library) each read and XACK every
entry. The raw leg moves opaque byte payloads of the same size with bare redis-py calls;
the record leg goes through StepRecord encode/decode, StreamProducer and StreamConsumer.
The ratio is what our codec and transport cost on top of Redis itself.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import redis

from slea.embedded_redis import EmbeddedRedis
from slea.records import StepRecord, encode

PROMPT_TOKENS = 1536
RESPONSE_TOKENS = 100
GROUPS = ("learner", "library")


def realistic_record(index: int, rng: np.random.Generator) -> StepRecord:
    """About 8 KB on the wire: 1.5k prompt tokens, 100 response tokens with log-probs."""
    return StepRecord(
        run_id="bench",
        task_id=f"task-{index // 64}",
        task_type="pick_and_place_simple",
        env_name="alfworld",
        group_id=f"group-{index // 64}",
        episode_id=f"episode-{index // 8}",
        step=index % 8,
        anchor_obs="You arrive at countertop 2. On the countertop 2, you see a mug 1, and a peppershaker 3.",
        prompt_ids=rng.integers(0, 49_152, PROMPT_TOKENS, dtype=np.int32),
        response_ids=rng.integers(0, 49_152, RESPONSE_TOKENS, dtype=np.int32),
        response_logprobs=-rng.random(RESPONSE_TOKENS, dtype=np.float32),
        action="take mug 1 from countertop 2",
        reward=0.0,
        policy_version=3,
        library_version=7,
        experience_ids=["s-12", "s-40", "w-3"],
        step_budget=50,
    )


def _produce(mode: str, url: str, stream: str, count: int, seed: int, batch_size: int) -> None:
    rng = np.random.default_rng(seed)
    client = redis.Redis.from_url(url)
    if mode == "records":
        from slea.streams import StreamProducer

        producer = StreamProducer(client, stream, batch_size=batch_size)
        for start in range(0, count, batch_size):
            producer.send([realistic_record(start + i, rng) for i in range(min(batch_size, count - start))])
    else:
        payload_size = len(encode(realistic_record(0, rng)))
        for start in range(0, count, batch_size):
            pipe = client.pipeline(transaction=False)
            for _ in range(min(batch_size, count - start)):
                pipe.xadd(stream, {b"r": rng.bytes(payload_size)})
            pipe.execute()


def _consume(mode: str, url: str, stream: str, group: str, total: int, read_count: int, done) -> None:
    client = redis.Redis.from_url(url)
    seen = 0
    if mode == "records":
        from slea.streams import StreamConsumer

        consumer = StreamConsumer(client, stream, group=group, consumer=f"{group}-0", dead_letter_key=stream + ":dead")
        while seen < total:
            deliveries = consumer.read(count=read_count, block_ms=200)
            consumer.ack([delivery.entry_id for delivery in deliveries])
            seen += len(deliveries)
    else:
        while seen < total:
            reply = client.xreadgroup(group, f"{group}-0", {stream: ">"}, count=read_count, block=200)
            entries = reply[0][1] if reply else []
            if entries:
                client.xack(stream, group, *[entry_id for entry_id, _fields in entries])
            seen += len(entries)
    done.put(seen)


def _run_leg(mode: str, url: str, records: int, producers: int, batch_size: int, read_count: int) -> float:
    stream = f"bench:{mode}"
    client = redis.Redis.from_url(url)
    client.delete(stream)
    for group in GROUPS:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    per_producer = records // producers
    total = per_producer * producers
    context = mp.get_context("spawn")
    done = context.Queue()
    consumers = [
        context.Process(target=_consume, args=(mode, url, stream, group, total, read_count, done)) for group in GROUPS
    ]
    writers = [
        context.Process(target=_produce, args=(mode, url, stream, per_producer, seed, batch_size))
        for seed in range(producers)
    ]
    for process in consumers:
        process.start()
    time.sleep(1.0)  # let the spawned consumers import and block before the clock starts
    started = time.perf_counter()
    for process in writers:
        process.start()
    for process in writers + consumers:
        process.join()
    elapsed = time.perf_counter() - started
    if any(process.exitcode for process in writers + consumers):
        raise RuntimeError(f"bench stream: a {mode} worker failed")
    consumed = [done.get() for _ in GROUPS]
    if min(consumed) < total:
        raise RuntimeError(f"bench stream: consumers saw {consumed} of {total} entries")
    client.delete(stream)
    return total / elapsed


def bench_stream(records: int = 20_000, producers: int = 4, batch_size: int = 64, read_count: int = 256) -> dict:
    """Run the raw and the record leg back to back (twice, interleaved, best of each) on one server."""
    sample = encode(realistic_record(0, np.random.default_rng(0)))
    with EmbeddedRedis(appendonly=False) as server:
        raw, rec = [], []
        for _ in range(2):
            raw.append(_run_leg("raw", server.url, records, producers, batch_size, read_count))
            rec.append(_run_leg("records", server.url, records, producers, batch_size, read_count))
    return {
        "records_per_s": round(max(rec), 1),
        "raw_records_per_s": round(max(raw), 1),
        "ratio": round(max(rec) / max(raw), 3),
        "record_bytes": len(sample),
        "records": records - records % producers,
        "producers": producers,
        "consumer_groups": len(GROUPS),
    }
