"""The driver's supervision of the learner and the library writer (driver/supervision.py), on
a real local Ray with small stand-in actors: a component's process killed, an exception raised by
its run(), a run() that finishes, and the restart budget run.max_failures running out. The whole
run healing itself is tests/test_chaos.py."""

import contextlib
import json
import os
import signal
import threading
import time

import pytest
import ray
from prometheus_client import REGISTRY

from driver.supervision import (
    CALL_TIMEOUT_S,
    ComponentFailed,
    Supervised,
    Supervisor,
    checkpoint_text,
    describe,
    in_background,
    snapshot_text,
)
from slea.stream_admin import GroupStats


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)
class StandIn:
    """A component whose run() finishes, raises, or waits until stop(), as the test asks."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.stopped = threading.Event()

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> int:
        if self.behaviour == "raise":
            raise ValueError("a bad record at entry 17-0")
        if self.behaviour == "wait":
            self.stopped.wait()
        return 7

    def stop(self) -> None:
        self.stopped.set()

    def drain_metrics(self) -> list[dict]:
        return [{"learner_step": 1}]


def stand_in(name: str, behaviours: list[str], **options) -> Supervised:
    """A supervised StandIn; each (re)start takes the next behaviour from `behaviours`."""

    def start():
        actor = StandIn.remote(behaviours.pop(0))
        return [actor], [actor.run.remote()]

    component = Supervised(name, start, lambda: "checkpoint v3 (learner step 3)", group="learner", **options)
    component.launch()
    return component


def restarts(component: str) -> float:
    return REGISTRY.get_sample_value("slea_run_component_restarts_total", {"component": component}) or 0.0


def until_finished(supervisor: Supervisor, component: Supervised, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if supervisor.finished(component, timeout_s=0.5):
            return True
    return False


def test_a_killed_learner_is_restarted_and_past_the_budget_the_run_stops_naming_it(local_ray):
    lines: list[str] = []
    supervisor = Supervisor(max_failures=1, say=lines.append)
    learner = stand_in("learner", ["wait", "wait"])
    before = restarts("learner")
    first = learner.head
    os.kill(ray.get(first.pid.remote()), signal.SIGKILL)
    assert not until_finished(supervisor, learner, timeout_s=5)  # restarted, and the new one runs on
    assert learner.head is not first and ray.get(learner.head.pid.remote())
    assert restarts("learner") == before + 1
    assert len(lines) == 1 and "learner died" in lines[0], lines
    assert lines[0].endswith("restarting from checkpoint v3 (learner step 3), failure 1 of 1 within 3600 s"), lines
    assert learner.call("drain_metrics") == [{"learner_step": 1}]

    os.kill(ray.get(learner.head.pid.remote()), signal.SIGKILL)
    with pytest.raises(ComponentFailed, match=r"the learner died \(.+\): 2 failures within 3600 s.+run.max_failures=1"):
        until_finished(supervisor, learner, timeout_s=30)
    assert learner.call("drain_metrics", default=[]) == []  # dead: the driver's poll goes on without it
    assert restarts("learner") == before + 1


def test_an_exception_in_run_is_named_and_the_raising_actor_is_killed(local_ray):
    lines: list[str] = []
    supervisor = Supervisor(max_failures=3, say=lines.append)
    learner = stand_in("learner", ["raise", "finish"])
    raised = learner.head
    assert until_finished(supervisor, learner)  # the restarted one finishes: the learner is done
    assert "(ValueError('a bad record at entry 17-0'))" in lines[0], lines
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(raised.pid.remote(), timeout=30)  # killed, not left holding its ports and memory


def test_a_library_writer_returning_before_it_is_stopped_is_a_failure(local_ray):
    lines: list[str] = []
    supervisor = Supervisor(max_failures=3, say=lines.append)
    library = stand_in("library writer", ["finish", "wait"], runs_until_stopped=True)
    before = restarts("library_writer")
    assert not until_finished(supervisor, library, timeout_s=3)
    assert restarts("library_writer") == before + 1
    assert "its run() returned before the driver stopped it" in lines[0], lines
    library.head.stop.remote()  # the driver's stop at the end of the run
    ray.get(library.runs, timeout=30)


def test_describe_keeps_a_dead_process_to_its_exit_detail(local_ray):
    actor = StandIn.remote("wait")
    run = actor.run.remote()
    os.kill(ray.get(actor.pid.remote()), signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError) as raised:
        ray.get(run, timeout=30)
    text = describe(raised.value)
    assert text and "\n" not in text and len(text) <= 300 and "class_name" not in text, text


def test_what_a_restart_resumes_from(tmp_path):
    assert checkpoint_text(tmp_path / "learner") == "the initial weights (no checkpoint yet)"
    saved = tmp_path / "learner" / "checkpoints" / "v00000004"
    saved.mkdir(parents=True)
    (saved / "state.json").write_text(json.dumps({"version": 4, "learner_step": 4}))
    (saved.parent / "latest").write_text("v00000004\n")
    assert checkpoint_text(tmp_path / "learner") == "checkpoint v4 (learner step 4)"
    assert snapshot_text(tmp_path) == "the snapshot published to Redis, if any"
    from library.persistence import snapshot_dir

    snapshot_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    (snapshot_dir(tmp_path) / "v000000012.jsonl").write_text("{}\n")
    assert snapshot_text(tmp_path) == "snapshot v000000012"


def test_a_start_up_step_in_the_background_hands_over_its_result_or_its_error():
    release = threading.Event()
    loaded = in_background(lambda: release.wait(5) and "learner")
    assert not loaded.done()  # the driver goes on while it loads
    release.set()
    assert loaded.result(timeout=5) == "learner"

    def fails():
        raise ValueError("learner.micro_batch_tokens does not fit")

    with pytest.raises(ValueError, match="micro_batch_tokens"):
        in_background(fails).result(timeout=5)


def started_by(outcomes: list) -> Supervised:
    """A supervised component without Ray whose starts take the next of `outcomes`: an exception
    is raised, a threading.Event is waited for (then it comes up), anything else is what it starts."""

    def start():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, threading.Event):
            assert outcome.wait(timeout=30), "the test never let the start finish"
        return ["its actor"], ["its run"]

    return Supervised("learner", start, lambda: "checkpoint v3 (learner step 3)", group="learner")


def test_a_restart_runs_beside_the_driver_which_goes_on_meanwhile():
    """A learner's rebuild takes as long as its ranks take to load (minutes for a large model): the
    restart returns at once, calls into the component answer their default without waiting, its
    heartbeat is not checked, and the driver's next polls pick the new actors up once they are there."""
    lines: list[str] = []
    supervisor = Supervisor(max_failures=3, say=lines.append, hang_timeout_s=1, clock=lambda: 1e9)
    rebuilt = threading.Event()
    learner = started_by([rebuilt])
    started = time.monotonic()
    supervisor.restart(learner, "its process died")
    assert learner.starting is not None and time.monotonic() - started < 1.0
    assert learner.call("drain_metrics", default=[]) == [] and learner.latest("stats", default="none") == "none"
    supervisor.check_heartbeat(learner, _group(lag=5, last_delivered_id="17-0"))  # restarting: not hung
    assert not supervisor.finished(learner, timeout_s=0.1) and learner.starting is not None
    rebuilt.set()
    assert not supervisor.finished(learner, timeout_s=30)
    assert learner.starting is None and learner.handles == ["its actor"] and learner.runs == ["its run"]
    assert supervisor.restarts == 1 and len(lines) == 1, lines


def test_a_restart_that_fails_counts_as_a_failure_and_is_tried_again():
    lines: list[str] = []
    supervisor = Supervisor(max_failures=3, say=lines.append)
    outcomes = [RuntimeError("no node can place the learner's ranks"), None]
    learner = started_by(outcomes)
    kills: list[list] = []
    learner.kill = lambda: kills.append(list(learner.handles))  # what each restart killed first
    supervisor.restart(learner, "its process died")
    assert not supervisor.finished(learner, timeout_s=30)  # the rebuild raised: one more failure, restarted
    assert supervisor.restarts == 2 and len(kills) == 2
    assert 'its restart failed (RuntimeError("no node can place the learner\'s ranks"))' in lines[1], lines
    assert not supervisor.finished(learner, timeout_s=30)  # the second rebuild comes up
    assert outcomes == [] and learner.starting is None and learner.handles == ["its actor"]
    never = started_by([RuntimeError("no node can place the learner's ranks")] * 5)
    with pytest.raises(ComponentFailed, match="no node can place"):  # a rebuild that never works ends the run
        supervisor.restart(never, "its process died")
        while True:
            supervisor.finished(never, timeout_s=30)


def test_max_failures_counts_within_the_failure_window():
    now = [0.0]
    supervisor = Supervisor(max_failures=2, say=lambda _line: None, window_s=3600, clock=lambda: now[0])
    for at in (0.0, 1800.0, 3700.0, 5500.0):  # never more than 2 within an hour: a long run survives rare faults
        now[0] = at
        supervisor.restart(started_by([None]), "its process died")
    now[0] = 5600.0  # the third within the hour of 3700 and 5500
    with pytest.raises(ComponentFailed, match=r"3 failures within 3600 s.+run.max_failures=2"):
        supervisor.restart(started_by([None]), "its process died")


def _group(lag: int, last_delivered_id: str) -> GroupStats:
    return GroupStats("learner", consumers=1, pending=0, lag=lag, last_delivered_id=last_delivered_id)


def test_a_component_that_reads_nothing_while_entries_wait_is_restarted_as_hung(local_ray):
    """A learner stopped with SIGSTOP: alive to Ray, answering nothing. The driver's calls into it
    give up after CALL_TIMEOUT_S, and once entries have waited for its group with none given to it
    for run.hang_timeout_s it is restarted: the stopped process is killed, the new one answers."""
    now = [0.0]
    lines: list[str] = []
    supervisor = Supervisor(max_failures=3, say=lines.append, hang_timeout_s=600, clock=lambda: now[0])
    learner = stand_in("learner", ["wait", "wait"])
    stopped_pid = ray.get(learner.head.pid.remote())
    os.kill(stopped_pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert learner.latest("drain_metrics", default="none") == "none"  # never waits
        assert time.monotonic() - started < 1.0
        assert learner.call("drain_metrics", default=[]) == []
        assert time.monotonic() - started < CALL_TIMEOUT_S + 5
        supervisor.check_heartbeat(learner, _group(lag=5, last_delivered_id="17-0"))  # first seen at 0
        for at, group in ((300.0, _group(0, "17-0")), (400.0, _group(5, "17-0"))):
            now[0] = at  # nothing waiting at 300 s: not hung; the count starts again there
            supervisor.check_heartbeat(learner, group)
        now[0] = 800.0  # entries have waited since 300 s, but not yet 600 s
        supervisor.check_heartbeat(learner, _group(5, "17-0"))
        assert supervisor.restarts == 0
        now[0] = 900.0
        supervisor.check_heartbeat(learner, _group(5, "17-0"))
        assert supervisor.restarts == 1
        assert "hung: no stream entry read for 600 s while 5 waited (run.hang_timeout_s)" in lines[0], lines
        assert learner.settle(timeout_s=30) is None and learner.starting is None
        assert ray.get(learner.head.pid.remote()) != stopped_pid
        assert learner.call("drain_metrics") == [{"learner_step": 1}]
        deadline = time.monotonic() + 30  # the new actor's answer comes back at a later ask
        while learner.latest("drain_metrics", default="none") == "none" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert learner.latest("drain_metrics") == [{"learner_step": 1}]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped_pid, signal.SIGCONT)
    now[0] = 5000.0  # reading again: entries given to its group keep it alive however long it runs
    supervisor.check_heartbeat(learner, _group(5, "18-0"))
    now[0] = 9000.0
    supervisor.check_heartbeat(learner, _group(5, "19-0"))
    assert supervisor.restarts == 1
    learner.kill()
