"""Each attempt of `slea train` leaves its log in the run directory (driver/run_log.py): what the
console showed, the driver's warnings and the failure, readable after the attempt's pods are gone.
The console itself shows what it showed before."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import driver.run_log
import driver.train
from driver.progress import RunConsole
from driver.run_log import LOGS_DIR, AttemptLog
from slea.config import load_config


def _console() -> tuple[RunConsole, io.StringIO]:
    out = io.StringIO()
    return RunConsole(Console(file=out, force_terminal=False)), out


def _print_some(console: RunConsole) -> None:
    console.note("[cyan]step 1/2[/] loss 0.5")
    with console.phase("starting Ray"):
        pass
    console.line("[green]done[/]: 2 steps")


def _without_seconds(text: str) -> str:
    return re.sub(r"\d+\.\ds", "_s", text)


def test_the_log_has_each_console_line_plain_and_the_console_is_unchanged(tmp_path):
    console, out = _console()
    _print_some(console)
    logged, logged_out = _console()
    logged.log = AttemptLog(tmp_path, host="slea-train-abc12-head-x7q")
    _print_some(logged)
    logged.log.close()

    assert _without_seconds(logged_out.getvalue()) == _without_seconds(out.getvalue())
    (attempt,) = (tmp_path / LOGS_DIR).iterdir()
    assert attempt.name.endswith("Z-slea-train-abc12-head-x7q"), "one directory per attempt, named by its head pod"
    lines = (attempt / "driver.log").read_text().splitlines()
    assert [line.split(" ", 1)[1].strip() for line in lines] == [
        line.strip() for line in out.getvalue().splitlines()
    ], "the console's lines, without markup"
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line) for line in lines), "each with its UTC time"


def test_a_failed_attempt_leaves_its_traceback_and_the_next_attempt_its_own_log(tmp_path, monkeypatch):
    config = load_config(None, [f"run.dir={tmp_path}", "run.id=cluster"])

    def crash(config, run_dir, console, resumed):
        console.note("learner started")
        raise RuntimeError("learner OOM-killed past run.max_failures")

    monkeypatch.setattr(driver.train, "_train", crash)
    with pytest.raises(RuntimeError):
        driver.train.train(config)
    (first,) = (tmp_path / "cluster" / LOGS_DIR).iterdir()
    text = (first / "driver.log").read_text()
    assert "learner started" in text
    assert "slea train failed: RuntimeError: learner OOM-killed past run.max_failures" in text
    assert "Traceback (most recent call last)" in text

    monkeypatch.setattr(driver.run_log.socket, "gethostname", lambda: "retry-head")
    monkeypatch.setattr(driver.train, "_train", lambda config, run_dir, console, resumed: 0)
    assert driver.train.train(config, resume_dir=str(tmp_path / "cluster")) == 0
    assert len(list((tmp_path / "cluster" / LOGS_DIR).iterdir())) == 2, "the retry's log is its own"


WARN = """
import logging, sys
from pathlib import Path
from driver.run_log import AttemptLog
if sys.argv[1] == "logged":
    log = AttemptLog(Path(sys.argv[2]), host="h")
logging.getLogger("actors.pool").warning("actor worker 3 could not stop cleanly")
"""


def test_the_drivers_warnings_go_into_the_log_and_still_onto_the_console(tmp_path):
    """In a process without logging handlers (slea train), as pytest's own would hide the difference."""

    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, "-c", WARN, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stderr

    assert run("plain") == run("logged", str(tmp_path)) == "actor worker 3 could not stop cleanly\n"
    (attempt,) = (tmp_path / LOGS_DIR).iterdir()
    assert "WARNING actors.pool: actor worker 3 could not stop cleanly" in (attempt / "driver.log").read_text()


def test_the_runbook_says_where_an_attempts_log_is():
    runbook = (Path(__file__).resolve().parents[2] / "docs" / "runbook.md").read_text()
    assert f"/mnt/slea-runs/<run id>/{LOGS_DIR}/<UTC start>-<head pod>/driver.log" in runbook
