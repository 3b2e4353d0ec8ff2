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
checks that before scheduling), so any worker's file serves."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

LANES_KEY = "slea_lanes_file"  # workerinput key: where a worker writes the lanes of its slow tests
WHOLE_RUN_LANE = "whole-run lane"  # the scope of the tests marked whole_run
SLOW_LANE = "slow lane"  # the scope of every other slow test
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
    return LaneScheduling(config, log, config.stash[_LANES_DIR])


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
