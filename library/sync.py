"""How Serve replicas follow the library writer through Redis.

The writer publishes each committed delta to the stream slea:<run>:library:deltas and each
snapshot to the key slea:<run>:library:snapshot. A replica starts from the snapshot, then
applies deltas in version order before every request it answers, so an answer never comes
from a version older than the last one published before the request arrived. A replica that
finds a gap (deltas trimmed while it was behind) reloads the snapshot. Each writer start is a
new epoch: a restarted writer resumes from its last snapshot and may renumber versions that
replicas already saw, so a delta of another epoch also sends a replica back to the snapshot.

A writer's start also names its run the current one (slea:current_library_run), in the same
transaction as its snapshot: a replica set to follow the current run (the RayService, which no
training job's run id is known to in advance) moves to a new run's library as soon as that run's
writer has published it, never to a run with nothing to serve yet. The pointer only moves forward:
a writer takes it only from a run whose library started no later than its own (the start time is
kept in slea:<run>:library:started from the run's first writer on), or whose keys have expired, so
a restarted writer of an older run never points the RayService back at a run that is not training.
Overwrites keep the key's expiry (SET KEEPTTL): the driver refreshes it (driver/retention.py).
"""

from __future__ import annotations

import json
import time
import uuid

import redis

from library.persistence import load_snapshot_text
from library.state import DeltaGap, Library
from slea.channels import CURRENT_LIBRARY_RUN_KEY, LibraryNotPublished
from slea.redis_conn import with_reconnect


def deltas_key(run_id: str) -> str:
    return f"slea:{run_id}:library:deltas"


def snapshot_key(run_id: str) -> str:
    return f"slea:{run_id}:library:snapshot"


def epoch_key(run_id: str) -> str:
    return f"slea:{run_id}:library:epoch"


def started_key(run_id: str) -> str:
    """Unix time the run's first library writer started: orders runs for slea:current_library_run."""
    return f"slea:{run_id}:library:started"


class Publisher:
    """Writer side: deltas as stream entries, snapshots as one key; trims deltas a snapshot covers.

    Every write rides out a Redis restart (reconnect with backoff, as the stream consumers do):
    the writer's worker thread must not die of an outage. A write repeated after a broken
    connection is harmless: replicas apply a delta only if its version is newer than theirs.
    """

    def __init__(self, client: redis.Redis, run_id: str, reconnect_max_s: float = 30.0):
        self.client = client
        self.run_id = run_id
        self.reconnect_max_s = reconnect_max_s
        self.epoch = uuid.uuid4().hex  # this writer's lifetime
        self._first_since_snapshot: str | None = None  # oldest delta replicas may still need

    def _retry(self, call):
        return with_reconnect(call, max_wait_s=self.reconnect_max_s, what="the library's deltas or snapshot")

    def start(self, text: str) -> None:
        """Begin an epoch from the writer's restored (or empty) state: old deltas go, the snapshot
        and epoch are replaced together so a replica never pairs one epoch with another's state,
        and the run becomes the current one for replicas that follow it unless a run whose library
        started later holds it (WATCH: a writer of that run starting at the same time retries)."""

        def replace(pipe) -> None:
            current, started = pipe.get(CURRENT_LIBRARY_RUN_KEY), pipe.get(started_key(self.run_id))
            started = float(started) if started is not None else time.time()
            take = current is None or current.decode() == self.run_id
            if not take:
                pipe.watch(started_key(current.decode()))
                theirs = pipe.get(started_key(current.decode()))
                take = theirs is None or float(theirs) <= started  # None: that run's keys expired
            pipe.multi()
            pipe.delete(deltas_key(self.run_id))
            pipe.set(snapshot_key(self.run_id), text, keepttl=True)
            pipe.set(epoch_key(self.run_id), self.epoch, keepttl=True)
            pipe.set(started_key(self.run_id), repr(started), nx=True)
            if take:  # from another run: its expiry is not this run's, the driver's next refresh sets ours
                pipe.set(
                    CURRENT_LIBRARY_RUN_KEY,
                    self.run_id,
                    keepttl=current is not None and current.decode() == self.run_id,
                )

        self._retry(lambda: self.client.transaction(replace, CURRENT_LIBRARY_RUN_KEY, started_key(self.run_id)))

    def published_snapshot(self) -> str | None:
        """The last snapshot published for this run (by any writer), or None if there is none."""
        text = self._retry(lambda: self.client.get(snapshot_key(self.run_id)))
        return None if text is None else text.decode()

    def publish_delta(self, delta: dict) -> str:
        payload = {b"d": json.dumps({**delta, "epoch": self.epoch})}
        entry_id = self._retry(lambda: self.client.xadd(deltas_key(self.run_id), payload)).decode()
        self._first_since_snapshot = self._first_since_snapshot or entry_id
        return entry_id

    def publish_snapshot(self, text: str) -> None:
        """Store the snapshot, then drop deltas older than the previous snapshot's period: a
        replica within one period catches up from deltas, one further behind reloads."""
        self._retry(lambda: self.client.set(snapshot_key(self.run_id), text, keepttl=True))
        keep_from, self._first_since_snapshot = self._first_since_snapshot, None
        if keep_from is not None:
            self._retry(lambda: self.client.xtrim(deltas_key(self.run_id), minid=keep_from, approximate=False))


class Follower:
    """Replica side: keeps a Library at the newest published version. Before the first snapshot
    every sync raises LibraryNotPublished, and the first sync after it loads the snapshot. With
    follow_current the run is the one the newest writer named current: when that changes, the
    next sync loads the new run's snapshot in place of the old run's library."""

    def __init__(self, client: redis.Redis, run_id: str, library: Library, follow_current: bool = False):
        self.client = client
        self.run_id = run_id
        self.library = library
        self.follow_current = follow_current
        self.last_entry: str | None = None  # id of the last delta entry read; None before the snapshot
        self.epoch: str | None = None  # writer epoch of the snapshot loaded

    def _bootstrap(self) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.get(snapshot_key(self.run_id))
        pipe.get(epoch_key(self.run_id))
        text, epoch = pipe.execute()
        if text is None:
            raise LibraryNotPublished(
                f"no library published yet for run {self.run_id}: its library writer has not started "
                f"(Redis key {snapshot_key(self.run_id)} is empty)"
            )
        load_snapshot_text(self.library, text.decode())
        self.epoch = epoch.decode()
        self.last_entry = "0-0"

    def sync(self) -> int:
        """Apply every delta published since the last sync; returns the library version."""
        if self.follow_current:
            self._follow_current_run()
        for _attempt in range(3):
            if self.last_entry is None:
                self._bootstrap()
            try:
                self._apply_new()
                return self.library.version
            except DeltaGap:
                self.last_entry = None
        raise RuntimeError(f"library replica of run {self.run_id} could not catch up with the writer's deltas")

    def _follow_current_run(self) -> None:
        current = self.client.get(CURRENT_LIBRARY_RUN_KEY)
        if current is None:
            raise LibraryNotPublished(
                f"no library published yet: no run has started a library writer on this Redis "
                f"(Redis key {CURRENT_LIBRARY_RUN_KEY} is empty)"
            )
        if current.decode() != self.run_id:  # a new run: its snapshot replaces the old run's library
            self.run_id, self.last_entry, self.epoch = current.decode(), None, None

    def _apply_new(self) -> None:
        while True:
            # One round trip: the epoch (a restarted writer may have published nothing new yet) and the deltas.
            pipe = self.client.pipeline(transaction=False)
            pipe.get(epoch_key(self.run_id))
            pipe.xrange(deltas_key(self.run_id), min=f"({self.last_entry}", count=512)
            epoch, entries = pipe.execute()
            if epoch is None or epoch.decode() != self.epoch:
                raise DeltaGap(f"writer epoch is now {epoch!r}, replica holds epoch {self.epoch}")
            if not entries:
                return
            for entry_id, fields in entries:
                delta = json.loads(fields[b"d"])
                if delta["epoch"] != self.epoch:  # a restart between the two reads above
                    raise DeltaGap(f"delta of writer epoch {delta['epoch']}, replica holds epoch {self.epoch}")
                if delta["version"] > self.library.version:
                    self.library.apply_delta(delta)
                self.last_entry = entry_id.decode()
