import subprocess
import sys
from pathlib import Path

import pytest

from slea.config import ConfigError, SleaConfig, dump_config, load_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_match_design():
    config = SleaConfig()
    assert config.actors.group_size == 8 and config.learner.tasks_per_step == 16
    assert config.learner.gamma == 0.95 and config.learner.omega == 1.0
    assert config.learner.clip_low == 0.2 and config.learner.clip_high == 0.28
    assert config.library.delta == 0.85 and config.library.max_tokens == 200
    assert config.library.strategy_capacity == {"principle": 100, "method": 100, "example": 100}
    assert config.stream_key() == "slea:local:steps" and config.dead_letter_key() == "slea:local:dead"


@pytest.mark.parametrize("name", ["local.yaml", "cluster.yaml", "gpu.yaml"])
def test_shipped_configs_validate(name):
    config = load_config(REPO / "configs" / name)
    assert dump_config(config)


def test_overrides_are_typed_yaml():
    config = load_config(REPO / "configs/local.yaml", ["learner.lr=3e-5", "actors.num_workers=3",
                                                      "envs.params.difficulty=hard", "library.enabled=false"])
    assert config.learner.lr == 3e-5 and config.actors.num_workers == 3
    assert config.envs.params["difficulty"] == "hard" and config.library.enabled is False


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["learner.lrr=1"], "unknown key 'learner.lrr'"),
        (["actors.num_workers=many"], "bad value for 'actors.num_workers'"),
        (["learner.advantage_mode=median"], "bad value for 'learner.advantage_mode'"),
        (["run.id=has space"], "bad value for 'run.id'"),
        (["nonsense"], "must look like key.path=value"),
        (["learner.lr.x=1"], "bad value for 'learner.lr'"),
        (["learner.lr=1", "learner.lr.x=1"], "'learner.lr' is not a section"),
    ],
)
def test_bad_values_name_the_key(overrides, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, overrides)


def test_bad_file_is_one_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("learner:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)


@pytest.mark.parametrize(
    "content, key",
    [("learner:\n  gama: 0.9\n", "learner.gama"), ("actors:\n  group_size: lots\n", "actors.group_size")],
)
def test_cli_exits_2_with_one_line_naming_the_key(tmp_path, content, key):
    path = tmp_path / "run.yaml"
    path.write_text(content)
    result = subprocess.run([sys.executable, "-m", "slea.cli", "train", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in result.stderr


def test_local_runs_listen_on_loopback_and_bound_serve_queues():
    config = load_config(Path(__file__).resolve().parents[2] / "configs/local.yaml")
    assert config.library.http_host == config.monitoring.metrics_host == "127.0.0.1"
    assert 1 <= config.library.target_ongoing_requests <= config.library.max_ongoing_requests
    assert config.library.max_queued_requests >= 1
    with pytest.raises(ConfigError, match="'library'.*target_ongoing_requests \\(9.0\\) must not exceed max_ongoing_requests \\(8\\)"):
        load_config(None, ["library.target_ongoing_requests=9"])
