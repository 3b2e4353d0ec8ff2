import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slea.config import (
    EDGE_DEFAULT_DISTILL_COEF,
    PRESETS,
    ConfigError,
    RunConfig,
    SleaConfig,
    check_trainable,
    dump_config,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]


def test_defaults_match_design():
    config = SleaConfig()
    assert config.actors.group_size == 8 and config.learner.tasks_per_step == 16
    assert config.learner.gamma == 0.95 and config.learner.omega == 1.0
    assert config.learner.clip_low == 0.2 and config.learner.clip_high == 0.28
    assert config.library.delta == 0.85 and config.library.max_tokens == 200
    assert config.library.strategy_capacity == {"principle": 100, "method": 100, "example": 100}
    assert config.stream_key() == "slea:local:steps" and config.dead_letter_key() == "slea:local:dead"


SHIPPED = sorted(path.name for path in (REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_shipped_config_takes_every_preset(name, preset):
    config = load_config(REPO / "configs" / name, [f"run.preset={preset}"])
    for dotted, value in PRESETS[preset].items():
        section, key = dotted.split(".")
        assert getattr(getattr(config, section), key) == value
    # The resolved config written into the run directory reads back as the same config (resume).
    assert load_config_text(dump_config(config)) == config


def load_config_text(text: str) -> SleaConfig:
    return SleaConfig.model_validate(yaml.safe_load(text))


def test_grpo_is_verl_agents_grpo():
    config = load_config(None, ["run.preset=grpo"])
    assert not config.library.enabled and config.actors.retrieval_mode == "none"
    assert config.learner.omega == 0.0 and config.learner.advantage_mode == "mean_std_norm"


def test_a_preset_never_silently_overwrites_a_key_it_fixes():
    with pytest.raises(
        ConfigError, match=r"run\.preset=grpo fixes learner\.omega=0\.0, but the config sets learner\.omega=0\.5"
    ):
        load_config(None, ["run.preset=grpo", "learner.omega=0.5"])
    with pytest.raises(ConfigError, match=r"run\.preset=task_retrieval fixes actors\.retrieval_mode='task'"):
        load_config(None, ["run.preset=task_retrieval", "actors.retrieval_mode=step"])
    # The same value is no conflict, and keys a preset does not fix stay free.
    config = load_config(None, ["run.preset=grpo", "learner.omega=0", "learner.gamma=0.9"])
    assert config.learner.omega == 0.0 and config.learner.gamma == 0.9
    # custom fixes nothing: an ablation such as step advantages without a library.
    custom = load_config(None, ["run.preset=custom", "library.enabled=false", "actors.retrieval_mode=none"])
    assert not custom.library.enabled and custom.learner.omega == 1.0


def test_presets_apply_to_configs_built_in_code():
    assert SleaConfig(run={"preset": "grpo"}).learner.advantage_mode == "mean_std_norm"
    assert SleaConfig(run=RunConfig(preset="task_retrieval")).actors.retrieval_mode == "task"


def test_run_edge_turns_on_ab_groups_and_the_distillation():
    config = load_config(None, ["run.edge=true"])
    assert config.actors.ab_groups and config.learner.edge_distill_coef == EDGE_DEFAULT_DISTILL_COEF
    custom = load_config(None, ["run.edge=true", "learner.edge_distill_coef=0.02"])
    assert custom.learner.edge_distill_coef == 0.02  # an explicit coefficient wins
    off = load_config(None, [])
    assert not off.actors.ab_groups and off.learner.edge_distill_coef == 0.0
    with pytest.raises(ConfigError, match=r"run\.edge=true fixes actors\.ab_groups=True"):
        load_config(None, ["run.edge=true", "actors.ab_groups=false"])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["run.edge=true", "run.preset=grpo"], "run.edge needs the experience library"),
        (["run.edge=true", "actors.group_size=1"], "run.edge needs actors.group_size >= 2"),
    ],
)
def test_run_edge_that_cannot_work_is_a_config_error(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, overrides)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["model.temperature=0"], "model.temperature=0.0 is greedy decoding"),
        (["model.top_p=0.9"], "model.top_p=0.9"),
    ],
)
def test_training_refuses_what_the_learner_cannot_score(overrides, expected):
    config = load_config(None, overrides)  # a valid config: evaluation may decode greedily
    with pytest.raises(ConfigError, match=expected):
        check_trainable(config)
    check_trainable(load_config(None, ["model.temperature=0.7"]))


def test_training_with_the_wandb_sink_but_no_wandb_says_how_to_install_it(monkeypatch):
    config = load_config(None, ["monitoring.sinks=[jsonl, wandb]"])
    check_trainable(config)  # installed here (the dev extra has it)
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package that is not there
    with pytest.raises(ConfigError, match=r"monitoring\.sinks lists wandb.*pip install 'slea-rl\[wandb\]'"):
        check_trainable(config)
    check_trainable(load_config(None, []))  # the default sinks need no extra


def test_cli_preset_conflict_exits_2_naming_both_keys():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "train",
            str(REPO / "configs/local.yaml"),
            "--set",
            "run.preset=grpo",
            "--set",
            "learner.omega=0.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert (
        "run.preset=grpo" in result.stderr and "learner.omega=0.5" in result.stderr and "Traceback" not in result.stderr
    )


def test_config_show_prints_the_resolved_config():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "config",
            "show",
            str(REPO / "configs/local.yaml"),
            "--set",
            "run.preset=grpo",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["run"]["preset"] == "grpo" and shown["library"]["enabled"] is False
    assert shown["learner"]["omega"] == 0.0 and shown["learner"]["advantage_mode"] == "mean_std_norm"
    assert (
        shown["actors"]["retrieval_mode"] == "none" and shown["envs"]["name"] == "textworld"
    )  # the file's own keys too


def test_overrides_are_typed_yaml():
    config = load_config(
        REPO / "configs/local.yaml",
        ["learner.lr=3e-5", "actors.num_workers=3", "envs.params.difficulty=hard", "library.k_warnings=0"],
    )
    assert config.learner.lr == 3e-5 and config.actors.num_workers == 3
    assert config.envs.params["difficulty"] == "hard" and config.library.k_warnings == 0


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
        (["monitoring.sinks=[tensorboard]"], "bad value for 'monitoring.sinks': Value error, must include jsonl"),
        (["monitoring.sinks=[jsonl, jsonl]"], "bad value for 'monitoring.sinks': Value error, names a sink twice"),
        (["monitoring.sinks=[jsonl, mlflow]"], "bad value for 'monitoring.sinks.1'"),
        (["monitoring.tensorboard=false"], "unknown key 'monitoring.tensorboard'"),  # now monitoring.sinks
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
    result = subprocess.run(
        [sys.executable, "-m", "driver.cli", "train", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in result.stderr


def test_local_runs_listen_on_loopback_and_bound_serve_queues():
    config = load_config(Path(__file__).resolve().parents[2] / "configs/local.yaml")
    assert config.library.http_host == config.monitoring.metrics_host == "127.0.0.1"
    assert 1 <= config.library.target_ongoing_requests <= config.library.max_ongoing_requests
    assert config.library.max_queued_requests >= 1
    with pytest.raises(
        ConfigError, match="'library'.*target_ongoing_requests \\(9.0\\) must not exceed max_ongoing_requests \\(8\\)"
    ):
        load_config(None, ["library.target_ongoing_requests=9"])


def test_a_collective_weight_transport_on_a_shared_gpu_is_refused():
    """NCCL refuses two ranks on one device; the GPU config shares one GPU (0.5 + 0.5)."""
    gpu = REPO / "configs/gpu.yaml"
    assert load_config(gpu).learner.weight_transport == "object_store"
    with pytest.raises(ConfigError, match="NCCL refuses the weight group"):
        load_config(gpu, ["learner.weight_transport=collective"])
    # Whole GPUs on either side cannot share one; CPU actors (vLLM CPU, transformers) use gloo or the object store.
    for overrides in (
        ["learner.num_gpus=1"],
        ["actors.num_gpus=1"],
        ["actors.num_gpus=0"],
        ["actors.engine=transformers"],
    ):
        load_config(gpu, ["learner.weight_transport=collective", *overrides])


def test_the_run_id_comes_from_the_variable_run_id_env_names(monkeypatch):
    """The RayJob's entrypoint names the variable, never its value: no shell on the way (KubeRay's
    submitter bash, Ray's sh on the head) can expand it to nothing (issue 35)."""
    monkeypatch.setenv("SLEA_RUN_ID", "cluster-exp2")
    config = load_config(None, ["run.id_env=SLEA_RUN_ID"])
    assert (config.run.id, config.run.id_env) == ("cluster-exp2", None)
    monkeypatch.setenv("SLEA_RUN_ID", "")
    with pytest.raises(ConfigError, match="run.id_env names the environment variable SLEA_RUN_ID"):
        load_config(None, ["run.id_env=SLEA_RUN_ID"])
    monkeypatch.setenv("SLEA_RUN_ID", "a/b")
    with pytest.raises(ConfigError, match="no spaces, ':' or slashes"):
        load_config(None, ["run.id_env=SLEA_RUN_ID"])
