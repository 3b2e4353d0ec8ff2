"""`slea scale` answers bad input and runs that are not going with one line and exit code 2, without Ray."""

import json
import socket
import subprocess
import sys

import pytest

from driver.cli import main

SLEA = [sys.executable, "-m", "driver.cli"]


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def last_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize("count, said", [("-1", "must be 0 or more, got -1"), ("two", "whole number of workers")])
def test_a_bad_worker_count_is_refused_by_name(count, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["scale", "some-run", "--actors", count])
    assert stopped.value.code == 2
    line = last_error_line(capsys)
    assert "--actors" in line and said in line


def test_the_worker_count_is_required():
    result = subprocess.run([*SLEA, "scale", "some-run"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--actors" in result.stderr


def test_a_missing_run_directory(tmp_path, capsys):
    assert main(["scale", str(tmp_path / "runs" / "nope"), "--actors", "2"]) == 2
    assert last_error_line(capsys) == f"slea scale: no run directory {tmp_path / 'runs' / 'nope'}"


def test_a_run_directory_whose_driver_stopped(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("run: {id: stopped}\n")  # a run that ran: config, no driver.json
    assert main(["scale", str(tmp_path), "--actors", "2"]) == 2
    line = last_error_line(capsys)
    assert line.startswith(f"slea scale: no run is going in {tmp_path}") and "no driver.json" in line


def test_a_stale_driver_file_says_the_cluster_is_gone(tmp_path, capsys):
    address = f"127.0.0.1:{closed_port()}"
    (tmp_path / "driver.json").write_text(json.dumps({"run_id": "gone", "ray_address": address}))
    assert main(["scale", str(tmp_path), "--actors", "0"]) == 2
    assert last_error_line(capsys).startswith(
        f"slea scale: no run 'gone' is going: nothing answers at its Ray address {address}"
    )


def test_a_run_id_on_an_address_where_nothing_runs(capsys):
    address = f"127.0.0.1:{closed_port()}"
    assert main(["scale", "cluster-20250301", "--actors", "3", "--address", address]) == 2
    assert "no run 'cluster-20250301' is going" in last_error_line(capsys)


def test_a_damaged_driver_file(tmp_path, capsys):
    (tmp_path / "driver.json").write_text("{not json")
    assert main(["scale", str(tmp_path), "--actors", "1"]) == 2
    assert "is not a driver file slea train wrote" in last_error_line(capsys)
