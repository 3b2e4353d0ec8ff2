"""Under `pytest -n N` the slow tests run one after another on one worker, the slow lane, while the
unit tests share the workers: two learners or whole runs at once outgrow a 2-core, 24 GiB machine
and trip each other's deadlines, but a unit test beside a whole run costs it little.

pytest-xdist's own way to say this, an `xdist_group` mark with `--dist loadgroup`, does nothing
under pytest 9.2: xdist 3.8.0 writes the group into `item._nodeid`, which pytest 9 no longer
reads. So the grouping happens here. The controller names a file for each worker
(`pytest_configure_node`); a worker writes the node ids of its slow tests there once it has
collected (`write_slow_ids`, from tests/conftest.py); the controller's scheduler, xdist's own
LoadScopeScheduling, reads them when it splits the collection into units and makes every slow
id one unit, which xdist hands whole to one worker. Every worker collects the same tests (xdist
checks that before scheduling), so any worker's file serves."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

SLOW_IDS_KEY = "slea_slow_ids_file"  # workerinput key: where a worker writes its slow node ids
SLOW_LANE = "slow lane"  # the scope every slow test shares
_IDS_DIR = pytest.StashKey[Path]()


class SlowLaneScheduling(LoadScopeScheduling):
    """LoadScopeScheduling where every slow test is in one scope and every other test is a scope
    of its own (so the unit tests spread over all workers)."""

    def __init__(self, config: pytest.Config, log, ids_dir: Path) -> None:
        super().__init__(config, log)
        self.ids_dir = ids_dir

    @functools.cached_property
    def slow_ids(self) -> frozenset[str]:
        """Read at the first split, which xdist makes once every worker has finished collecting."""
        files = sorted(self.ids_dir.glob("*.ids"))
        if not files:
            raise RuntimeError(f"no worker wrote its slow test ids under {self.ids_dir}")
        return frozenset(files[0].read_text().splitlines())

    def _split_scope(self, nodeid: str) -> str:
        return SLOW_LANE if nodeid in self.slow_ids else nodeid

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
    """On the controller, before a worker starts: tell it where to write its slow ids (a directory
    of this run's own, made for the first worker)."""
    stash = node.config.stash
    if _IDS_DIR not in stash:
        stash[_IDS_DIR] = Path(tempfile.mkdtemp(prefix="slea-slow-lane-"))
    node.workerinput[SLOW_IDS_KEY] = str(stash[_IDS_DIR] / f"{node.gateway.id}.ids")


def remove_ids(config: pytest.Config) -> None:
    """On the controller, at its end: the id files go (tests/conftest.py leaves by os._exit, so no
    cleanup registered with pytest would run)."""
    if _IDS_DIR in config.stash:
        shutil.rmtree(config.stash[_IDS_DIR], ignore_errors=True)


def make_scheduler(config: pytest.Config, log):
    """The slow lane for `--dist loadgroup` (pyproject's addopts); xdist's own for any other --dist."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return SlowLaneScheduling(config, log, config.stash[_IDS_DIR])


def write_slow_ids(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: write the node ids of the slow tests it collected for the controller."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or SLOW_IDS_KEY not in workerinput:
        return
    slow = [item.nodeid for item in items if item.get_closest_marker("slow") is not None]
    path = Path(workerinput[SLOW_IDS_KEY])
    partial = path.with_suffix(".partial")  # renamed whole: the controller never reads half a file
    partial.write_text("\n".join(slow))
    partial.rename(path)
