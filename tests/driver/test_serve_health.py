"""driver/serve_health.py: a library deployment that turns UNHEALTHY (Serve replacing a failed
replica) is said and counted once, its recovery said, a Serve that cannot answer skipped, and
all of it while the caller's own thread is held; the statuses are a table stepped by hand (the
real Serve is the chaos test's, tests/test_chaos.py)."""

import threading

from prometheus_client import REGISTRY

from driver.serve_health import ServeHealth

FAILED = "A replica's health check failed. This deployment will be UNHEALTHY until the replica recovers or a new deploy happens."
REPLACEMENT = [
    {"Retrieval": ("HEALTHY", "")},
    {"Retrieval": ("UNHEALTHY", FAILED)},
    {"Retrieval": ("UNHEALTHY", FAILED)},  # still replacing: not a second failure
    RuntimeError("controller restarting"),
    {"Retrieval": ("HEALTHY", "")},
    {"Retrieval": ("HEALTHY", "")},
]
SAID = [
    f"[yellow]a Serve replica of Retrieval failed[/] ({FAILED}): Serve is replacing it",
    "Retrieval is healthy again: Serve replaced its failed replica",
]


def replica_restarts() -> float:
    return REGISTRY.get_sample_value("slea_run_component_restarts_total", {"component": "serve_replica"}) or 0.0


class Timeline:
    """serve_deployment_statuses stand-in: each call answers the next entry (an exception is raised),
    then the last one again; `told` is set once every entry was answered."""

    def __init__(self, entries: list):
        self.entries, self.asked, self.told = list(entries), [], threading.Event()

    def __call__(self, app_name: str):
        self.asked.append(app_name)
        answer = self.entries.pop(0) if len(self.entries) > 1 else self.entries[0]
        if len(self.entries) == 1:
            self.told.set()
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_failed_replica_is_said_and_counted_once_and_its_replacement_said():
    timeline = Timeline(REPLACEMENT)
    said: list[str] = []
    health = ServeHealth("slea-library", said.append, timeline)
    before = replica_restarts()
    for _ in range(len(REPLACEMENT)):
        health.poll()
    assert timeline.asked == ["slea-library"] * len(REPLACEMENT)
    assert said == SAID
    assert health.replaced == 1 and replica_restarts() - before == 1


def test_a_replacement_is_seen_while_the_callers_thread_is_held():
    """The driver's loop can wait tens of seconds on a restarting component (a chaos run missed a whole
    replacement when the poll lived there): the watching thread asks on its own schedule."""
    timeline = Timeline(REPLACEMENT)
    said: list[str] = []
    health = ServeHealth("slea-library", said.append, timeline)
    with health.watching(every_s=0.01):
        assert timeline.told.wait(timeout=30), f"asked only {len(timeline.asked)} times"  # the caller, held
    asked = len(timeline.asked)
    threading.Event().wait(0.05)
    assert len(timeline.asked) == asked, "the thread asked on after the block ended"
    assert said == SAID and health.replaced == 1
