"""An actor worker's steps on their way to the stream: a step leaves only once Redis has it.

Steps wait here until an XADD of them succeeds. StreamProducer.send already retries a broken
connection for `redis.reconnect_max_s`; a write Redis refuses for being full (maxmemory with
noeviction) keeps the steps here and is tried again with backoff, and once `max_steps` wait, the
episodes that produce them wait too (the worker's backpressure: its memory stays bounded, and a
full Redis holds the pool still instead of the pool dropping steps). Writes failing for longer
than `window_s` raise StepsLost: the steps still waiting are counted in
slea_actor_steps_lost_total and named in an error line, and the worker's loop ends. Its restart
marks the episodes it had in flight abandoned, so the learner drops their groups at once instead
of timing them out, and no episode with a gap is ever trained.
"""

from __future__ import annotations

import asyncio
import logging
import time

from monitoring.metrics import metric
from slea.records import StepRecord
from slea.redis_conn import RedisBackpressure, RedisUnavailable
from slea.streams import StreamProducer

BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 2.0

log = logging.getLogger(__name__)


class StepsLost(RuntimeError):
    """Redis refused or could not take a worker's steps for longer than redis.reconnect_max_s."""


class Outbox:
    """Steps played and not yet in the stream, oldest first."""

    def __init__(self, producer: StreamProducer, *, max_steps: int, window_s: float, worker_label: str):
        self.producer = producer
        self.max_steps = max_steps  # actors.max_outbox_steps: episodes wait while this many are unsent
        self.window_s = window_s  # redis.reconnect_max_s: how long writes may fail before the steps count lost
        self.worker_label = worker_label
        self.records: list[StepRecord] = []
        self._failing_since: float | None = None  # monotonic time of the first failed write of a streak
        self._retry_at = 0.0
        self._delay = BACKOFF_START_S

    def add(self, record: StepRecord) -> None:
        self.records.append(record)

    @property
    def full(self) -> bool:
        return len(self.records) >= self.max_steps

    def flush(self) -> bool:
        """Write what waits, batch by batch, each batch leaving only once written; a failed write is
        tried again after its backoff. True when nothing waits; StepsLost once writes failed too long."""
        now = time.monotonic()
        if now < self._retry_at:
            return not self.records
        while self.records:
            batch = self.records[: self.producer.batch_size]
            try:
                self.producer.send(batch)
            except RedisBackpressure as exc:
                self._failed(exc, "redis_full", now)
                return False
            except RedisUnavailable as exc:  # send already retried for the whole window
                self._failed(exc, "redis_unreachable", now, retried=True)
                return False
            del self.records[: len(batch)]
        self._failing_since, self._retry_at, self._delay = None, 0.0, BACKOFF_START_S
        return True

    async def drain(self) -> None:
        """Wait until every step waiting here is in the stream (or StepsLost)."""
        while not self.flush():
            await asyncio.sleep(max(self._retry_at - time.monotonic(), BACKOFF_START_S))

    def _failed(self, exc: Exception, reason: str, since: float, retried: bool = False) -> None:
        if self._failing_since is None:
            self._failing_since = since
        failing_s = time.monotonic() - self._failing_since
        if failing_s < self.window_s and not retried:
            self._retry_at = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, BACKOFF_MAX_S)
            return
        episodes = len({record.episode_id for record in self.records})
        lost = self.count_lost(reason)
        message = (
            f"actor worker {self.worker_label}: Redis did not take its steps for {failing_s:.0f} s "
            f"(redis.reconnect_max_s={self.window_s:g}; {reason}): {lost} steps of {episodes} episodes lost, "
            f"counted in slea_actor_steps_lost_total; its episodes in flight are marked abandoned when its loop "
            f"restarts. Last error: {exc}"
        )
        log.error(message)
        raise StepsLost(message) from exc

    def count_lost(self, reason: str) -> int:
        """Count every step still waiting as lost and drop it (nothing will send it: the loop failed)."""
        lost = len(self.records)
        self.records.clear()
        self._failing_since, self._retry_at, self._delay = None, 0.0, BACKOFF_START_S  # a restarted loop starts afresh
        if lost:
            metric("actor_steps_lost_total").labels(worker=self.worker_label, reason=reason).inc(lost)
        return lost
