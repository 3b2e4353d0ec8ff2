"""Under `pytest -n N` the slow tests run in two lanes, each one test after another on one worker,
while the unit tests share the workers: the whole-run lane (tests marked `whole_run`: a whole
`slea train`, a Ray cluster of several nodes, chaos) and the slow lane (every other slow test: one
component on a local Ray, one model, one engine). Two whole runs at once outgrow a 2-core, 24 GiB
machine and trip each other's deadlines; a whole run beside one component test, or beside unit
tests, costs it little.

pytest-xdist's own way to say this, an `xdist_group` mark with `--dist loadgroup`, does nothing
under pytest 9.2: xdist 3.8.0 writes the group into `item._nodeid`, which pytest 9 no longer
reads. So the grouping happens here. The controller names a file for each worker
(`pytest_configure_node`); a worker writes the lane of each of its slow tests there once it has
collected (`write_lanes`, from tests/conftest.py); the controller's scheduler, xdist's own
LoadScopeScheduling, reads them when it splits the collection into units and makes each lane
one unit, which xdist hands whole to one worker. Every worker collects the same tests (xdist
checks that before scheduling), so any worker's file serves.

At the end the controller says what each lane cost and when its last test ended (`LaneClock`):
the lane that ends last is the suite's critical path, and CI's output is where that is read."""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

LANES_KEY = "slea_lanes_file"  # workerinput key: where a worker writes the lanes of its slow tests
WHOLE_RUN_LANE = "whole-run lane"  # the scope of the tests marked whole_run
SLOW_LANE = "slow lane"  # the scope of every other slow test
UNIT_TESTS = "unit tests"  # every test in no lane: they share the workers
_LANES_DIR = pytest.StashKey[Path]()


class LaneScheduling(LoadScopeScheduling):
    """LoadScopeScheduling where each lane is one scope and every other test is a scope of its own
    (so the unit tests spread over all workers)."""

    def __init__(self, config: pytest.Config, log, lanes_dir: Path) -> None:
        super().__init__(config, log)
        self.lanes_dir = lanes_dir

    @functools.cached_property
    def lanes(self) -> dict[str, str]:
        """node id -> lane; read at the first split, which xdist makes once every worker has finished collecting."""
        files = sorted(self.lanes_dir.glob("*.lanes"))
        if not files:
            raise RuntimeError(f"no worker wrote the lanes of its slow tests under {self.lanes_dir}")
        return dict(line.split("\t", 1)[::-1] for line in files[0].read_text().splitlines())

    def _split_scope(self, nodeid: str) -> str:
        return self.lanes.get(nodeid, nodeid)

    def remove_node(self, node) -> str | None:
        """LoadScopeScheduling's, except that the test that crashed the node is not handed out again:
        xdist reports it failed, and LoadScopeScheduling re-queued it, so the replacement worker
        crashed on it in turn until the run hung (a native segfault in one unit test did that)."""
        workload = self.assigned_work.pop(node)
        pending = [(scope, nodeid) for scope, unit in workload.items() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        crash_scope, crashitem = pending[0]
        workload[crash_scope][crashitem] = True
        self.workqueue.update({scope: unit for scope, unit in workload.items() if False in unit.values()})
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem


def configure_node(node) -> None:
    """On the controller, before a worker starts: tell it where to write its lanes (a directory of
    this run's own, made for the first worker)."""
    stash = node.config.stash
    if _LANES_DIR not in stash:
        stash[_LANES_DIR] = Path(tempfile.mkdtemp(prefix="slea-slow-lane-"))
    node.workerinput[LANES_KEY] = str(stash[_LANES_DIR] / f"{node.gateway.id}.lanes")


def remove_lane_files(config: pytest.Config) -> None:
    """On the controller, at its end: the lane files go (tests/conftest.py leaves by os._exit, so no
    cleanup registered with pytest would run)."""
    if _LANES_DIR in config.stash:
        shutil.rmtree(config.stash[_LANES_DIR], ignore_errors=True)


def make_scheduler(config: pytest.Config, log):
    """The two lanes for `--dist loadgroup` (pyproject's addopts); xdist's own for any other --dist."""
    if config.getvalue("dist") != "loadgroup":
        return None
    global _clock
    scheduler = LaneScheduling(config, log, config.stash[_LANES_DIR])
    _clock = LaneClock(scheduler)
    return scheduler


@dataclass
class LaneTime:
    """What one lane cost a session."""

    tests: int = 0
    seconds: float = 0.0  # setup + call + teardown of its tests, summed
    ended_s: float = 0.0  # since the scheduler was made (before any test ran), when its last test's last phase ended


class LaneClock:
    """On the controller: each report's phase time, added to its test's lane."""

    def __init__(self, scheduler: LaneScheduling) -> None:
        self.scheduler = scheduler
        self.started = time.time()
        self.lanes: dict[str, LaneTime] = {}

    def add(self, report: pytest.TestReport) -> None:
        lane = self.lanes.setdefault(self.scheduler.lanes.get(report.nodeid, UNIT_TESTS), LaneTime())
        lane.tests += report.when == "call"
        lane.seconds += report.duration
        lane.ended_s = max(lane.ended_s, report.stop - self.started)

    def lines(self) -> list[str]:
        """One line a lane, the one that ended last first."""
        return [
            f"{name}: {lane.tests} tests, {lane.seconds:.0f} s of their own time, the last ended at {lane.ended_s:.0f} s"
            + (" (over every worker)" if name == UNIT_TESTS else "")
            for name, lane in sorted(self.lanes.items(), key=lambda pair: -pair[1].ended_s)
        ]


_clock: LaneClock | None = None  # the controller's, once it made the scheduler; None on a worker or without -n


def clock_report(report: pytest.TestReport) -> None:
    if _clock is not None:
        _clock.add(report)


def summarize_lanes(terminal) -> None:
    if _clock is not None and _clock.lanes:
        terminal.write_sep("-", "lanes (tests/slow_lane.py): the one that ended last is the critical path")
        for line in _clock.lines():
            terminal.write_line(line)


def lane_of(item: pytest.Item) -> str | None:
    """The lane a test runs in under `pytest -n`; None for a unit test."""
    if item.get_closest_marker("whole_run") is not None:
        return WHOLE_RUN_LANE
    if item.get_closest_marker("slow") is not None:
        return SLOW_LANE
    return None


def write_lanes(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: write "lane<TAB>node id" for each slow test it collected, for the controller."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or LANES_KEY not in workerinput:
        return
    lines = [f"{lane}\t{item.nodeid}" for item in items if (lane := lane_of(item)) is not None]
    path = Path(workerinput[LANES_KEY])
    partial = path.with_suffix(".partial")  # renamed whole: the controller never reads half a file
    partial.write_text("\n".join(lines))
    partial.rename(path)
