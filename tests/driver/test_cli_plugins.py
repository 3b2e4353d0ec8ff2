"""`--plugin` on `slea play`, `slea eval` and `slea train`, with the adapter of docs/adding-an-env.md:
the doc shows that exact file, `slea play` plays it, and `slea train` carries it to the Ray actors.
The same `slea train` also sizes its own actor pool (`actors.autoscale`, driver/pool_control.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_run

from driver.cli import _plugin_overrides, build_parser, main
from driver.local_ray import LOOPBACK_SWITCH
from driver.run_outputs import read_metrics
from slea.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SLEA = [sys.executable, "-m", "driver.cli"]
ADAPTER = "docs/examples/taxi_env.py"
TAXI = f"taxi={ADAPTER}:TaxiTextEnv"


def slea(*args: str, timeout: int = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*SLEA, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_the_doc_shows_the_adapter_file_verbatim():
    doc = (ROOT / "docs" / "adding-an-env.md").read_text()
    block = re.search(rf"<!-- the block below is {ADAPTER}, verbatim.*?-->\n```python\n(.*?)```\n", doc, re.DOTALL)
    assert block is not None, f"docs/adding-an-env.md lost its marked code block of {ADAPTER}"
    assert block.group(1) == (ROOT / ADAPTER).read_text()


@pytest.mark.parametrize(("policy", "success"), [("expert", 1.0), ("random", 0.0)])
def test_slea_play_plays_the_doc_adapter(policy, success):
    result = slea("play", "--plugin", TAXI, "--policy", policy, "--episodes", "30", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["env"] == "taxi" and report["episodes"] == 30 and report["invalid_action_rate"] == 0.0
    assert report["success_rate"] == success, report  # the BFS expert always delivers; 30 random moves never do
    assert list(report["by_task_type"]) == ["taxi"]


def test_a_plugin_with_an_env_flag_from_another_directory(tmp_path):
    adapter = str(ROOT / ADAPTER)
    result = slea("play", "--env", "cab", "--plugin", f"cab={adapter}:TaxiTextEnv", "--episodes", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "env: cab" in result.stdout and "success_rate: 1.0" in result.stdout


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["play", "--plugin", "taxi=no_such_module_xyz:TaxiTextEnv"], "no module named 'no_such_module_xyz'"),
        (["play", "--plugin", f"taxi={ADAPTER}:Taxi"], "has no class 'Taxi'; it defines TaxiTextEnv"),
        (["play", "--plugin", f"taxi={ADAPTER}:MAP"], "'MAP' is not an env class"),
        (["play", "--plugin", "taxi"], "--plugin 'taxi' must be NAME=module:Class or NAME=path/to/adapter.py:Class"),
        (["play", "--plugin", TAXI, "--plugin", "b=x:Y"], "say which env to play with --env NAME"),
        (["train", "configs/local.yaml", "--plugin", "taxi=docs/examples/no_such_file.py:X"], "no such file"),
        (["eval", "any-model", "--plugin", "taxi=no_such_module_xyz:X"], "no module named 'no_such_module_xyz'"),
    ],
)
def test_a_bad_plugin_is_one_line_and_exit_2(command, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    # `train` sets the loopback switch for the Ray it would start; monkeypatch puts it back after the
    # test, so later tests' clusters take Ray's own node address
    monkeypatch.setenv(LOOPBACK_SWITCH, "1")
    assert main(command) == 2  # train and eval fail here, before Redis, Ray or a model start
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_train_and_eval_put_plugins_in_the_config(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    args = build_parser().parse_args(["train", "configs/local.yaml", "--plugin", TAXI, "--set", "envs.name=taxi"])
    config = load_config(args.config, [*args.overrides, *_plugin_overrides(args)])
    assert config.envs.plugins == {"taxi": f"{ROOT / ADAPTER}:TaxiTextEnv"}  # absolute: Ray workers find it
    written = tmp_path / "run.yaml"
    written.write_text("envs:\n  plugins:\n    taxi: some.module:Other\n    other: pkg.mod:Env\n")
    args = build_parser().parse_args(["eval", "model", "--config", str(written), "--plugin", TAXI])
    merged = load_config(args.config, [*args.overrides, *_plugin_overrides(args)]).envs.plugins
    assert merged == {"taxi": f"{ROOT / ADAPTER}:TaxiTextEnv", "other": "pkg.mod:Env"}  # --plugin wins


@pytest.fixture(scope="module")
def taxi_run(tmp_path_factory, tiny_model_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """The doc's `slea train ... --plugin` with tiny settings, sizing its own actor pool on the way
    (`actors.autoscale`): one whole run serves the plugin's tests and the pool sizer's. One worker
    plays one group of 2 at a time and the learner wants 2 groups a step: it waits most of its time
    (a tiny model trains in milliseconds), so the first decision grows the pool."""
    run_root = tmp_path_factory.mktemp("taxi-run")
    settings = [
        *tiny_run(run_root, "taxi", tiny_model_dir),
        "envs.name=taxi",
        "envs.params={}",
        "envs.panel_size=2",
        "actors.num_workers=1",
        "actors.autoscale.min_workers=1",
        "actors.autoscale.max_workers=2",
        "actors.autoscale.interval_s=4",
        "learner.tasks_per_step=2",
        "learner.max_steps=8",
        "learner.checkpoint_every=4",
        "eval.every=8",  # before the first update and after the last
        "eval.panel_size=2",
        "eval.samples_per_task=1",
        "monitoring.sinks=[jsonl]",
        "monitoring.plots=false",
    ]
    overrides = [arg for setting in settings for arg in ("--set", setting)]
    result = slea("train", "configs/local.yaml", "--plugin", TAXI, *overrides, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run_root / "taxi"


@pytest.mark.slow
def test_train_with_a_file_plugin_reaches_the_actor_workers_and_the_evaluator(taxi_run):
    """Actor workers and the evaluator are Ray actors, so their taxi episodes show the plugin
    travelled in the config."""
    _result, run_dir = taxi_run
    assert "docs/examples/taxi_env.py:TaxiTextEnv" in (run_dir / "config.yaml").read_text()
    metrics = read_metrics(run_dir)
    assert any("actors/success_rate/taxi" in line for line in metrics), metrics[-1]
    assert any("eval/success_rate" in line for line in metrics)


@pytest.mark.slow
def test_a_learner_waiting_for_groups_grows_the_pool(taxi_run):
    result, run_dir = taxi_run
    assert "actor pool: 1 -> 2 workers (autoscale: learner waited" in result.stderr, result.stderr[-3000:]
    assert "-> 1 workers" not in result.stderr  # nothing held the workers back: no reason to shrink
    steps = [line for line in read_metrics(run_dir) if "learner/policy_version" in line]
    assert [line["learner/policy_version"] for line in steps] == list(range(1, 9))
    assert not (run_dir / "driver.json").exists()
