"""The step stream: a pipelined producer and an at-least-once consumer-group reader.

Semantics (docs/architecture.md, "The step stream"): every consumer group sees every entry; a consumer
reads its own pending entries first after a restart, then new ones; it acknowledges only
after the caller says the effect is durable; entries idle too long in a dead consumer are
claimed (XPENDING + XCLAIM); an entry delivered `max_deliveries` times, or one that does not decode,
moves to the dead-letter stream with the reason, so one poison record never stops a group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from monitoring.metrics import metric
from slea.records import RecordDecodeError, StepRecord, decode, encode
from slea.redis_conn import RedisBackpressure, with_reconnect

PAYLOAD_FIELD = b"r"
# Dead letters kept (oldest dropped beyond it): a consumer failing on every entry must not fill
# Redis with copies of the stream; SleaDeadLetters alerts long before the bound matters.
DEAD_LETTER_MAXLEN = 10_000


@dataclass
class Delivery:
    """One stream entry handed to a consumer."""

    entry_id: str  # Redis stream id, e.g. "1700000000000-0"; pass it to ack()
    record: StepRecord  # decoded payload


def ensure_group(client: redis.Redis, stream: str, group: str) -> None:
    """Create the group at the start of the stream (MKSTREAM); an existing group is left alone."""
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


class StreamProducer:
    """XADDs StepRecords in pipelined batches (one round trip per batch)."""

    def __init__(self, client: redis.Redis, stream: str, *, batch_size: int = 64, reconnect_max_s: float = 30.0):
        self.client = client
        self.stream = stream
        self.batch_size = batch_size
        self.reconnect_max_s = reconnect_max_s
        self._produced = metric("stream_records_produced_total").labels(stream=stream)
        self._bytes = metric("stream_bytes_produced_total").labels(stream=stream)
        self._reconnects = metric("stream_reconnects_total").labels(stream=stream, role="producer")

    def send(self, records: list[StepRecord]) -> list[str]:
        """Encode and append records; returns their entry ids in order."""
        payloads = [encode(record) for record in records]
        return self.send_payloads(payloads)

    def send_payloads(self, payloads: list[bytes]) -> list[str]:
        ids: list[str] = []
        for start in range(0, len(payloads), self.batch_size):
            batch = payloads[start : start + self.batch_size]
            ids.extend(
                with_reconnect(
                    lambda batch=batch: self._xadd_batch(batch),
                    max_wait_s=self.reconnect_max_s,
                    on_retry=self._reconnects.inc,
                )
            )
            self._produced.inc(len(batch))
            self._bytes.inc(sum(len(payload) for payload in batch))
        return ids

    def _xadd_batch(self, batch: list[bytes]) -> list[str]:
        pipe = self.client.pipeline(transaction=False)
        for payload in batch:
            pipe.xadd(self.stream, {PAYLOAD_FIELD: payload})
        try:
            return [entry_id.decode() for entry_id in pipe.execute()]
        except redis.exceptions.OutOfMemoryError as exc:  # Redis's "OOM command not allowed ..." reply
            metric("stream_backpressure_total").labels(stream=self.stream).inc()
            raise RedisBackpressure(
                f"Redis is full (maxmemory reached, policy noeviction) and refused XADD to {self.stream}: a consumer "
                f"group is behind, so the stream cannot be trimmed. Check the consumers (runbook: "
                f"SleaRedisMemoryNearLimit, SleaConsumerStalled); the steps of this batch were not written. ({exc})"
            ) from None


class StreamConsumer:
    """One consumer of one group: read() -> [Delivery], ack(ids) after the effect is durable."""

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        *,
        group: str,
        consumer: str,
        dead_letter_key: str,
        max_deliveries: int = 5,
        claim_idle_ms: int = 60_000,
        reconnect_max_s: float = 30.0,
        dead_letter_maxlen: int = DEAD_LETTER_MAXLEN,
    ):
        self.client = client
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dead_letter_key = dead_letter_key
        self.dead_letter_maxlen = dead_letter_maxlen
        self.max_deliveries = max_deliveries
        self.claim_idle_ms = claim_idle_ms
        self.reconnect_max_s = reconnect_max_s
        self._pending_cursor: str | None = "0"  # re-read own pending entries first; None once drained
        self._next_claim = 0.0
        self._consumed = metric("stream_records_consumed_total").labels(stream=stream, group=group)
        self._acked = metric("stream_records_acked_total").labels(stream=stream, group=group)
        self._claimed = metric("stream_records_claimed_total").labels(stream=stream, group=group)
        self._reconnects = metric("stream_reconnects_total").labels(stream=stream, role=f"consumer:{group}")
        self._retry(lambda: ensure_group(client, stream, group))

    def _retry(self, call):
        return with_reconnect(
            call, max_wait_s=self.reconnect_max_s, on_retry=self._on_reconnect, what=f"a dead letter from {self.stream}"
        )

    def _on_reconnect(self) -> None:
        self._reconnects.inc()
        self._pending_cursor = "0"  # what was in flight before the outage is re-read, never skipped

    def read(self, count: int = 256, block_ms: int = 1000) -> list[Delivery]:
        """Own pending entries first, then entries claimed from dead consumers, then new ones (blocking)."""
        if self._pending_cursor is not None:
            deliveries = self._retry(lambda: self._read_pending(count))
            if deliveries:
                return deliveries
        if time.monotonic() >= self._next_claim:
            self._next_claim = time.monotonic() + self.claim_idle_ms / 2000
            deliveries = self._retry(lambda: self.claim_idle(count))
            if deliveries:
                return deliveries
        return self._retry(lambda: self._read_new(count, block_ms))

    def _read_pending(self, count: int) -> list[Delivery]:
        reply = self.client.xreadgroup(self.group, self.consumer, {self.stream: self._pending_cursor}, count=count)
        entries = reply[0][1] if reply else []
        if not entries:
            self._pending_cursor = None
            return []
        self._pending_cursor = entries[-1][0].decode()
        return self._decode_entries(self._drop_overdelivered(entries))

    def _drop_overdelivered(self, entries):
        """A consumer that keeps crashing on the same pending entry must not loop on it forever:
        this re-read already counted as a delivery, so more than max_deliveries means poison."""
        counts = {
            entry["message_id"]: entry["times_delivered"]
            for entry in self.client.xpending_range(
                self.stream,
                self.group,
                min=entries[0][0],
                max=entries[-1][0],
                count=len(entries),
                consumername=self.consumer,
            )
        }
        kept = []
        for raw_id, fields in entries:
            delivered = counts.get(raw_id, 0)
            if delivered > self.max_deliveries and fields is not None:
                self._dead_letter(
                    raw_id.decode(), fields.get(PAYLOAD_FIELD, b""), f"delivered {delivered} times without ack"
                )
            else:
                kept.append((raw_id, fields))
        return kept

    def _read_new(self, count: int, block_ms: int) -> list[Delivery]:
        reply = self.client.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        return self._decode_entries(reply[0][1] if reply else [])

    def claim_idle(self, count: int = 256) -> list[Delivery]:
        """Take over entries idle longer than claim_idle_ms in *other* consumers (dead ones); dead-letter
        those delivered too often.

        XPENDING + XCLAIM of explicit ids rather than XAUTOCLAIM: XAUTOCLAIM would also take back
        this consumer's own entries that it deliberately holds unacknowledged (the learner keeps
        them until its next checkpoint), redelivering them and counting them towards poison.
        """
        stale = self.client.xpending_range(
            self.stream, self.group, min="-", max="+", count=count, idle=self.claim_idle_ms
        )
        claimable = []
        for entry in stale:
            if entry["consumer"].decode() == self.consumer:
                continue
            entry_id = entry["message_id"].decode()
            if entry["times_delivered"] >= self.max_deliveries:
                found = self.client.xrange(self.stream, min=entry_id, max=entry_id)
                payload = found[0][1].get(PAYLOAD_FIELD, b"") if found else b""
                self._dead_letter(entry_id, payload, f"delivered {entry['times_delivered']} times without ack")
            else:
                claimable.append(entry_id)
        if not claimable:
            return []
        entries = self.client.xclaim(self.stream, self.group, self.consumer, self.claim_idle_ms, claimable)
        claimed_ids = {raw_id.decode() for raw_id, _fields in entries}
        vanished = [entry_id for entry_id in claimable if entry_id not in claimed_ids]
        if vanished:  # trimmed while pending in a dead consumer: nothing left to process
            self.client.xack(self.stream, self.group, *vanished)
        self._claimed.inc(len(entries))
        return self._decode_entries(entries)

    def reclaim_forgotten(self, held: set[str], count: int = 10_000) -> list[Delivery]:
        """This consumer's own pending entries, idle longer than claim_idle_ms, that its caller does
        not hold (`held`: the entry ids it keeps in memory, unacknowledged on purpose), handed to it
        again. A Redis that crashes and loses the last second of its AOF (`appendfsync everysec`)
        undoes the XACKs of that second: those entries are pending again under this consumer, which
        has forgotten them, and read() does not re-read them when the connection came back without
        an error (redis-py reconnects by itself). Nobody else would ever take them (claim_idle skips
        its own), and the oldest of them holds trimming back for good."""
        stale = self._retry(
            lambda: self.client.xpending_range(
                self.stream,
                self.group,
                min="-",
                max="+",
                count=count,
                consumername=self.consumer,
                idle=self.claim_idle_ms,
            )
        )
        forgotten = [entry["message_id"].decode() for entry in stale if entry["message_id"].decode() not in held]
        if not forgotten:
            return []
        entries = self._retry(
            lambda: self.client.xclaim(self.stream, self.group, self.consumer, self.claim_idle_ms, forgotten)
        )
        self._claimed.inc(len(entries))
        return self._decode_entries(entries)

    def _decode_entries(self, entries) -> list[Delivery]:
        deliveries = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode()
            if fields is None:  # pending entry whose payload was trimmed away
                self.client.xack(self.stream, self.group, entry_id)
                continue
            payload = fields.get(PAYLOAD_FIELD)
            try:
                if payload is None:
                    raise RecordDecodeError(f"entry has no '{PAYLOAD_FIELD.decode()}' field")
                deliveries.append(Delivery(entry_id, decode(payload)))
            except RecordDecodeError as exc:
                self._dead_letter(entry_id, payload or b"", f"malformed: {exc}")
        self._consumed.inc(len(deliveries))
        return deliveries

    def _dead_letter(self, entry_id: str, payload: bytes, reason: str) -> None:
        """Keep the entry with its reason in slea:<run>:dead (the newest dead_letter_maxlen, trimmed
        exactly: dead letters are rare, so the exact trim costs nothing), then ack it so the group
        moves on."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(
            self.dead_letter_key,
            {
                "source_stream": self.stream,
                "source_id": entry_id,
                "group": self.group,
                "reason": reason,
                "payload": payload,
                "at": str(time.time()),
            },
            maxlen=self.dead_letter_maxlen,
            approximate=False,
        )
        pipe.xack(self.stream, self.group, entry_id)
        pipe.execute()
        kind = reason.split(":", 1)[0] if reason.startswith("malformed") else "max_deliveries"
        metric("stream_dead_lettered_total").labels(stream=self.stream, group=self.group, reason=kind).inc()

    def ack(self, entry_ids: list[str]) -> None:
        """Acknowledge entries whose effect is durable (checkpointed, snapshotted, or deliberately dropped)."""
        if entry_ids:
            self._retry(lambda: self.client.xack(self.stream, self.group, *entry_ids))
            self._acked.inc(len(entry_ids))
