"""The driver keeps the learner and the library writer running, as Ray keeps the actor workers.

A learner or library writer that dies (its process killed, out of memory, an exception on one
bad record) does not end the run: the driver kills what is left of it and starts a new one,
which resumes by itself (the learner from its latest checkpoint, re-reading its pending stream
entries, the version line continuing where the registry left it; the writer from its latest
snapshot, or Redis's). `run.max_failures` bounds the failures of both together within
`run.failure_window_s`, so a component that dies on every start (a bad config, a poison entry
the dead-letter path cannot catch) stops the run with its last error instead of looping forever,
while a long run survives rare faults spread over days; past it the driver raises ComponentFailed
and `_shutdown` still stops the others in order (the library's final snapshot). A restart that
fails (no node can place the learner, its rebuild killed) is one more failure, and is tried again.

A component can also hang: alive, answering nothing, reading nothing (a stopped process, a
deadlock, a stuck collective). Its heartbeat is the stream itself: the last entry its consumer
group was given. When entries wait for the group and none is given for `run.hang_timeout_s`, the
component is restarted as if it had died. The driver's calls into a component time out
(CALL_TIMEOUT_S), so a hung one cannot hang the driver too.

A restart runs on a thread of its own (`in_background`): a learner's rebuild waits for every rank
to load the model and join DeepSpeed, tens of seconds here and minutes for a large model on a
cluster, and the driver's loop goes on meanwhile: the actor workers' restarts, the other
component, the stream's trimming, the pool's sizing and the display do not wait for it. Calls into
a component that is restarting answer their default at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import ray

from monitoring.metrics import metric
from slea.stream_admin import GroupStats

T = TypeVar("T")
ERROR_CHARS = 300  # of a dead component's error in the console line and the final message
CALL_TIMEOUT_S = 10.0  # a call the driver makes into a component (its actors serve calls concurrently)


class ComponentFailed(RuntimeError):
    """A component failed once more than `run.max_failures` allows within the window: the run stops."""


def in_background(start: Callable[[], T]) -> Future[T]:
    """`start()` on a daemon thread, its result or exception in the future: a start that only waits
    on Ray overlaps the driver's own work (the learner's first load beside the library and the
    actors, every restart), and a run stopped meanwhile (Ctrl-C) does not wait for it at exit (Ray's
    shutdown ends what it started)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(start())
        except BaseException as exc:  # the caller raises or counts it where it reads the result
            future.set_exception(exc)

    threading.Thread(target=run, name="slea-start", daemon=True).start()
    return future


@dataclass
class Supervised:
    """One supervised component: its Ray actors (the first is the one the driver talks to) and
    their run() calls, and how to start it and say what it resumes from."""

    name: str  # "learner" | "library writer": the console's word and the metric's label
    start: Callable[[], tuple[list, list]]  # -> (actor handles, their run() object refs)
    resumes_from: Callable[[], str]  # "checkpoint v3", "snapshot v000000012": what a restart continues
    group: str  # the stream consumer group it reads: its heartbeat
    runs_until_stopped: bool = False  # the library writer: its run() returning at all is a failure
    handles: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    last_read: tuple[str, float] = ("", 0.0)  # (its group's last delivered entry, clock() when first seen)
    starting: Future | None = None  # a restart's start() in flight on a thread of its own
    _asking: dict[str, Any] = field(default_factory=dict)  # method -> its call in flight (latest())
    _answers: dict[str, Any] = field(default_factory=dict)  # method -> its last answer (latest())

    def launch(self) -> None:
        """Start it and wait until it is up (the run's first start: the driver has nothing else to do yet)."""
        self._adopt(self.start())

    def relaunch(self) -> None:
        """Start it again on a thread of its own; `settle` picks the result up."""
        self.handles, self.runs, self._asking = [], [], {}
        self.starting = in_background(self.start)

    def settle(self, timeout_s: float = 0.0) -> BaseException | None:
        """Wait up to `timeout_s` for a restart in flight: once it is done the component runs on its
        new actors (`starting` is None again), or the start's exception is returned for the
        supervisor to count."""
        if self.starting is None:
            return None
        try:
            started = self.starting.result(timeout=timeout_s)
        except FutureTimeout:
            return None
        except Exception as exc:  # any start failure is the component's, not the driver's
            self.starting = None
            return exc
        self.starting = None
        self._adopt(started)
        return None

    def _adopt(self, started: tuple[list, list]) -> None:
        self.handles, self.runs = started
        self.last_read = ("", 0.0)  # the next heartbeat check starts counting

    @property
    def head(self):
        return self.handles[0]

    def call(self, method: str, default=None):
        """`head.method()`, or `default` while it is restarting, dead or does not answer within
        CALL_TIMEOUT_S (the next check restarts a dead one; the heartbeat a hung one)."""
        if not self.handles:
            return default
        try:
            return ray.get(getattr(self.head, method).remote(), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return default

    def latest(self, method: str, default=None):
        """The newest answer of `head.method()` that has come back, without waiting: one call in
        flight at a time, asked again once it answered. A component that is restarting, still being
        constructed or busy gives its last answer (or `default`) instead of holding up the driver."""
        if self.handles:
            if method not in self._asking:
                self._asking[method] = getattr(self.head, method).remote()
            ready, _ = ray.wait([self._asking[method]], timeout=0)
            if ready:
                asked = self._asking.pop(method)
                with contextlib.suppress(ray.exceptions.RayError):  # died meanwhile: its restart comes next
                    self._answers[method] = ray.get(asked)
        return self._answers.get(method, default)

    def kill(self) -> None:
        for handle in self.handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)


class Supervisor:
    """Checks each component every poll and restarts a dead or hung one, up to `max_failures`
    within any `window_s` seconds (run.failure_window_s), all components together."""

    def __init__(
        self,
        max_failures: int,
        say: Callable[[str], None],
        window_s: float = 3600.0,
        hang_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_failures = max_failures
        self.say = say  # one line to the driver's console
        self.window_s = window_s
        self.hang_timeout_s = hang_timeout_s  # run.hang_timeout_s; None: no hang check
        self.clock = clock
        self.restarts = 0  # of all components so far
        self._failures: deque[float] = deque()  # clock() of each failure within the window

    def finished(self, component: Supervised, timeout_s: float = 0.0) -> bool:
        """Wait up to `timeout_s` for a run() to return: True when the component finished its work
        (the learner at learner.max_steps); a failure restarts it (or raises ComponentFailed), as
        does a restart whose start failed."""
        if component.starting is not None:
            failed = component.settle(timeout_s)
            if failed is not None:
                self.restart(component, f"its restart failed ({describe(failed)})")
            return False
        done, _ = ray.wait(component.runs, timeout=timeout_s)
        if not done:
            return False
        try:
            ray.get(done)  # a rank that failed raises here, before waiting on ranks stuck behind it
            if not component.runs_until_stopped:
                ray.get(component.runs, timeout=60)  # the other ranks follow rank 0 out
                return True
            error = "its run() returned before the driver stopped it"
        except (ray.exceptions.RayError, TimeoutError) as exc:
            error = describe(exc)
        self.restart(component, error)
        return False

    def check_heartbeat(self, component: Supervised, group: GroupStats | None) -> None:
        """Restart the component when entries have waited for its consumer group (lag > 0) and
        none was given to it for `hang_timeout_s`: it is alive but makes no progress."""
        now = self.clock()
        if self.hang_timeout_s is None or group is None or component.starting is not None:
            return
        last_id, since = component.last_read
        if group.lag == 0 or group.last_delivered_id != last_id:
            component.last_read = (group.last_delivered_id, now)
            return
        if now - since >= self.hang_timeout_s:
            self.restart(
                component,
                f"hung: no stream entry read for {now - since:.0f} s while {group.lag} waited (run.hang_timeout_s)",
            )

    def restart(self, component: Supervised, error: str) -> None:
        """Kill what is left of the component and start it again in the background (`finished`
        picks the start up; one that raises is one more failure, restarted in turn), until the
        budget runs out (ComponentFailed)."""
        component.kill()  # a rank that raised is still alive, holding its ports, memory and process group
        self._count_failure(component, error)
        self.restarts += 1
        metric("run_component_restarts_total").labels(component=component.name.replace(" ", "_")).inc()
        self.say(
            f"[yellow]{component.name} died[/] ({error}): restarting from {component.resumes_from()}, "
            f"failure {len(self._failures)} of {self.max_failures} within {self.window_s:g} s"
        )
        component.relaunch()

    def _count_failure(self, component: Supervised, error: str) -> None:
        now = self.clock()
        while self._failures and self._failures[0] <= now - self.window_s:
            self._failures.popleft()
        if len(self._failures) >= self.max_failures:
            raise ComponentFailed(
                f"the {component.name} died ({error}) after {self.restarts} restart(s): {len(self._failures) + 1} failures within "
                f"{self.window_s:g} s (run.failure_window_s) of the learner and library writer, more than "
                f"run.max_failures={self.max_failures} allows: the run stops. Its run directory resumes with "
                "`slea train --resume <run dir>` once the cause is fixed."
            )
        self._failures.append(now)


def describe(exc: BaseException) -> str:
    """A dead component's error in one short line: the exception a task raised, or why Ray says the
    actor's process died (its exit detail: killed by a signal, out of memory), not Ray's whole essay."""
    if isinstance(exc, ray.exceptions.RayTaskError) and not isinstance(exc, ray.exceptions.RayActorError):
        text = repr(exc.cause) if exc.cause is not None else str(exc).splitlines()[0]
    elif isinstance(exc, ray.exceptions.RayActorError):
        text = str(exc)
        detail = text.split("Worker exit detail: ", 1)
        text = detail[1].split(". ", 1)[0] if len(detail) == 2 else "its process died"
    else:
        text = repr(exc)
    text = " ".join(text.split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def checkpoint_text(learner_dir: Path) -> str:
    """What a restarted learner resumes from: its latest checkpoint's version, or the initial weights."""
    from learner.checkpoint import latest_checkpoint, read_state

    found = latest_checkpoint(learner_dir / "checkpoints")
    if found is None:
        return "the initial weights (no checkpoint yet)"
    state = read_state(found)
    return f"checkpoint v{state.version} (learner step {state.learner_step})"


def snapshot_text(run_dir: Path) -> str:
    """What a restarted library writer resumes from: its latest snapshot here, else Redis's copy."""
    from library.persistence import latest_snapshot

    found = latest_snapshot(run_dir)
    return f"snapshot {found.stem}" if found is not None else "the snapshot published to Redis, if any"
