"""A new run never lands on an existing one: not on its run directory, not on its stream in an
external Redis (real redis-server; the refusal comes before Ray or anything else starts)."""

import subprocess
import sys
from pathlib import Path

import pytest

from slea.config import load_config
from slea.services import RunExists, prepare_run_dir

SLEA = [sys.executable, "-m", "driver.cli"]
LOCAL = str(Path(__file__).resolve().parents[2] / "configs" / "local.yaml")


def run_config(tmp_path, redis_url, run_id="taken"):
    return load_config(LOCAL, [f"run.dir={tmp_path}", f"run.id={run_id}", f"redis.url={redis_url}"])


def test_slea_train_refuses_a_run_whose_stream_exists_in_one_line(tmp_path, redis_client, redis_url):
    redis_client.xadd("slea:taken:steps", {b"p": b"a step of the earlier run"})
    result = subprocess.run(
        [
            *SLEA,
            "train",
            LOCAL,
            "--set",
            f"run.dir={tmp_path}",
            "--set",
            "run.id=taken",
            "--set",
            f"redis.url={redis_url}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "slea:taken:steps" in lines[0] and "--resume" in lines[0] and "run.id" in lines[0]
    assert not (tmp_path / "taken").exists(), "the refused run left a run directory behind"
    assert redis_client.xlen("slea:taken:steps") == 1


def test_a_new_run_gets_its_directory_and_config(tmp_path, redis_url):
    run_dir = prepare_run_dir(run_config(tmp_path, redis_url, "fresh"))
    assert run_dir == tmp_path / "fresh" and (run_dir / "config.yaml").is_file()


def test_an_existing_run_directory_is_refused_without_resume(tmp_path, redis_url):
    config = run_config(tmp_path, redis_url)
    prepare_run_dir(config)
    with pytest.raises(RunExists, match="--resume"):
        prepare_run_dir(config)


def test_resume_continues_on_the_existing_directory_and_stream(tmp_path, redis_client, redis_url):
    config = run_config(tmp_path, redis_url)
    run_dir = prepare_run_dir(config)
    redis_client.xadd(config.stream_key(), {b"p": b"step"})
    assert prepare_run_dir(config, resume_dir=str(run_dir)) == run_dir
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        prepare_run_dir(config, resume_dir=str(tmp_path / "elsewhere"))
