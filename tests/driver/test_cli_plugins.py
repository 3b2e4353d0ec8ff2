"""`--plugin` on `slea play`, `slea eval` and `slea train`, with the adapter of docs/adding-an-env.md:
the doc shows that exact file, `slea play` plays it, and `slea train` carries it to the Ray actors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_train_with_a_file_plugin_reaches_the_actor_workers_and_the_evaluator(tmp_path, tiny_model_dir):
    """The doc's `slea train ... --plugin` with tiny settings: actor workers and the evaluator are Ray
    actors, so their taxi episodes show the plugin travelled in the config."""
    result = slea(
        "train",
        "configs/local.yaml",
        "--plugin",
        TAXI,
        *("--set", "envs.name=taxi", "--set", "envs.params={}", "--set", "envs.max_steps=3"),
        *("--set", f"run.dir={tmp_path}", "--set", "run.id=taxi", "--set", f"model.name={tiny_model_dir}"),
        *("--set", "model.max_new_tokens=8", "--set", "learner.max_steps=2", "--set", "actors.group_size=2"),
        *("--set", "envs.panel_size=2", "--set", "eval.panel_size=2", "--set", "eval.samples_per_task=1"),
        *("--set", "eval.every=2", "--set", "learner.checkpoint_every=2"),
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "taxi"
    assert "docs/examples/taxi_env.py:TaxiTextEnv" in (run_dir / "config.yaml").read_text()
    metrics = read_metrics(run_dir)
    assert any("actors/success_rate/taxi" in line for line in metrics), metrics[-1]
    assert any("eval/success_rate" in line for line in metrics)
