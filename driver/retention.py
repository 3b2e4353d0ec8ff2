"""A run's keys in a shared Redis expire `redis.retention_s` after its last driver stopped, however
it stopped (deploy/README.md), and never while a driver runs it.

The driver sets that expiry on every key of its run when it starts (a resumed run's stop expiry is
replaced) and refreshes it from a thread of its own every `refresh_interval_s`, so keys created
since (a dead letter, a worker's in-flight hash) get one within an interval, and a driver killed
with SIGKILL (an evicted head pod: no `finally` runs) leaves keys that go `retention_s` after its
last refresh. A refresh is not undone by the components: they overwrite string keys with SET
KEEPTTL. What a refresh cannot reach: a key created in the last interval before a SIGKILL keeps no
expiry (a worker's in-flight hash, re-created with each group); docs/runbook.md says how to find it.

`slea:current_library_run` names whichever run published a library last; while it names this run
it gets the same expiry, so a RayService never follows a run whose library keys are gone.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import redis

from driver.progress import RunConsole
from slea.channels import CURRENT_LIBRARY_RUN_KEY
from slea.config import SleaConfig
from slea.redis_conn import connect
from slea.stream_admin import expire_run

REFRESH_MAX_S = 30.0  # the longest a key created during a run goes without an expiry

log = logging.getLogger(__name__)


def refresh_interval_s(retention_s: float) -> float:
    """A quarter of the retention (a short test retention still refreshes in time), at most REFRESH_MAX_S."""
    return min(retention_s / 4, REFRESH_MAX_S)


def expire_run_and_pointer(client: redis.Redis, run_id: str, seconds: int) -> int:
    """expire_run, and the current-library pointer too while it names this run; returns the run's key count."""
    expired = expire_run(client, run_id, seconds)
    if client.get(CURRENT_LIBRARY_RUN_KEY) == run_id.encode():
        client.expire(CURRENT_LIBRARY_RUN_KEY, seconds)
    return expired


class Refresher(threading.Thread):
    """Sets the run's expiry again every interval until stop(); a refresh that fails (Redis away) is
    logged and tried again at the next interval: the driver's own poll decides when an outage ends the run."""

    def __init__(self, config: SleaConfig):
        super().__init__(name="slea-retention", daemon=True)
        self.client = connect(config.redis)
        self.run_id, self.retention_s = config.run.id, config.redis.retention_s
        self._stopping = threading.Event()  # not `_stop`: threading.Thread has a method of that name

    def run(self) -> None:
        failing = False
        while not self._stopping.wait(refresh_interval_s(self.retention_s)):
            try:
                expire_run_and_pointer(self.client, self.run_id, self.retention_s)
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("could not refresh the expiry of run %s's Redis keys (%s); retrying", self.run_id, exc)
                failing = True

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)
        self.client.close()


@contextlib.contextmanager
def retained(config: SleaConfig, console: RunConsole):
    """The run's keys expire `redis.retention_s` after the block ends, or after a SIGKILL of this process."""
    client = connect(config.redis)
    refresher = Refresher(config)
    try:
        expire_run_and_pointer(client, config.run.id, config.redis.retention_s)
        refresher.start()
        yield
    finally:
        if refresher.is_alive():
            refresher.stop()
        days = config.redis.retention_s / 86400
        try:
            expired = expire_run_and_pointer(client, config.run.id, config.redis.retention_s)
            console.note(
                f"Redis keeps this run's {expired} keys for {days:g} days (redis.retention_s), then drops them"
            )
        except redis.RedisError as exc:  # Redis gone at the very end: the last refresh's expiry stands
            console.note(
                f"[yellow]could not set this run's keys to expire in Redis ({exc}); the last refresh's stands[/]"
            )
        finally:
            client.close()
