"""Under `pytest -n` the slow tests run in two lanes (tests/slow_lane.py), each one test at a time
on one worker, so that two whole runs never share the machine, while the unit tests run on every
worker. The case runs pytest with the suite's conftest on a small test file in a subprocess, with
two workers, as `.ci/run` runs the suite."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SEVEN_TESTS = """
import os
import time
from pathlib import Path

import pytest

OUT = Path(os.environ["WORKER_LOG"])


def record(name):
    (OUT / name).write_text(os.environ["PYTEST_XDIST_WORKER"])
    time.sleep(0.5)  # long enough that a free worker would take the next test


@pytest.mark.slow
def test_slow_one():
    record("slow_one")


@pytest.mark.slow
def test_slow_two():
    record("slow_two")


@pytest.mark.slow
def test_slow_three():
    record("slow_three")


@pytest.mark.whole_run
def test_whole_run_one():
    record("whole_run_one")


@pytest.mark.whole_run
def test_whole_run_two():
    record("whole_run_two")


def test_fast_one():
    record("fast_one")


def test_fast_two():
    record("fast_two")
"""


def test_each_lane_keeps_to_one_worker_and_the_two_lanes_run_side_by_side(tmp_path):
    out = tmp_path / "workers"
    out.mkdir()
    result = run_with_two_workers(tmp_path, SEVEN_TESTS, WORKER_LOG=str(out))
    workers = {path.name: path.read_text() for path in out.iterdir()}
    expected = {"slow_one", "slow_two", "slow_three", "whole_run_one", "whole_run_two", "fast_one", "fast_two"}
    if result.returncode != 0 or set(workers) != expected:
        pytest.fail(f"the inner run failed: {result.stdout[-3000:]}{result.stderr[-3000:]}")
    slow_workers = {workers[name] for name in ("slow_one", "slow_two", "slow_three")}
    whole_run_workers = {workers[name] for name in ("whole_run_one", "whole_run_two")}
    assert len(slow_workers) == 1, f"the slow lane ran on {sorted(slow_workers)}"
    assert len(whole_run_workers) == 1, f"the whole-run lane ran on {sorted(whole_run_workers)}"
    # The lanes are the biggest units, so each worker takes one first: they overlap.
    assert slow_workers != whole_run_workers, f"both lanes ran on {sorted(slow_workers)}"
    # The summary says what each lane cost (each test sleeps 0.5 s) and when its last test ended.
    summary = result.stdout[result.stdout.index("lanes (tests/slow_lane.py)") :].splitlines()[1:4]
    costs = {}
    for line in summary:
        name, tests, seconds, ended = re.fullmatch(
            r"(.+): (\d+) tests, (\d+) s of their own time, the last ended at (\d+) s.*", line
        ).groups()
        costs[name] = (int(tests), int(seconds), int(ended))
    assert {name: cost[0] for name, cost in costs.items()} == {"slow lane": 3, "whole-run lane": 2, "unit tests": 2}
    assert costs["slow lane"][1] >= 1 and costs["whole-run lane"][1] >= 1
    assert all(seconds <= ended + 1 for _, seconds, ended in (costs["slow lane"], costs["whole-run lane"]))


CRASHING_TESTS = """
import os
import signal


def test_before():
    pass


def test_crash():
    os.kill(os.getpid(), signal.SIGSEGV)  # as a native library's segfault would


def test_after():
    pass
"""


def test_a_crashed_worker_fails_its_test_and_the_run_goes_on(tmp_path):
    """The test that crashed a worker is reported failed and not handed out again (re-queued, it
    crashed each replacement in turn and the run hung)."""
    result = run_with_two_workers(tmp_path, CRASHING_TESTS)
    assert result.returncode == 1 and "1 failed, 2 passed" in result.stdout, result.stdout[-3000:]
    assert "test_inner.py::test_crash" in result.stdout


def run_with_two_workers(tmp_path, tests_source: str, **environment) -> subprocess.CompletedProcess:
    """pytest -n 2 (--dist loadgroup, as pyproject sets it) on `tests_source` with the suite's conftest."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(tests_source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=os.environ | environment | {"PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
