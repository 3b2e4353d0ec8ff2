"""Under `pytest -n` the slow tests are meant to run one at a time on one worker (tests/conftest.py
marks each with one xdist_group; --dist loadgroup keeps a group on one worker), so that two learners
or whole runs never share the machine. The case runs pytest with the suite's conftest on a small
test file in a subprocess, with two workers.

It fails today, so it is a strict xfail: pytest-xdist 3.8.0 groups by a suffix it writes to
`item._nodeid`, and pytest 9.2's `nodeid` no longer reads that attribute, so every xdist_group is
ignored (in the first whole-suite run under `-n 2`, two vLLM engine tests ran at once). Until an
xdist release fixes it, the whole suite runs serially (README); when one does, this test passes,
the strict xfail fails the run, and the mark goes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FOUR_TESTS = """
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


def test_fast():
    record("fast")
"""


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="pytest-xdist 3.8.0's xdist_group has no effect under pytest 9.2 (item._nodeid is unread)",
)
def test_slow_tests_share_one_worker_under_xdist(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_four.py").write_text(FOUR_TESTS)
    out = tmp_path / "workers"
    out.mkdir()
    environment = os.environ | {"WORKER_LOG": str(out), "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    workers = {path.name: path.read_text() for path in out.iterdir()}
    if result.returncode != 0 or set(workers) != {"slow_one", "slow_two", "slow_three", "fast"}:
        # pytest.fail, not assert: the xfail expects only the grouping's AssertionError
        pytest.fail(f"the inner run failed: {result.stdout[-3000:]}{result.stderr[-3000:]}")
    slow_workers = {workers[name] for name in ("slow_one", "slow_two", "slow_three")}
    assert len(slow_workers) == 1, f"the slow tests ran on {sorted(slow_workers)}"
