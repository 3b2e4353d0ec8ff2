"""Env plugins: an adapter named by module or by file, loaded once, and every bad spec named in one line."""

from __future__ import annotations

import pickle
import sys
import textwrap

import pytest

from actors.envs.registry import PluginError, env_class, load_plugins, make_env
from slea.config import ConfigError, load_config

ADAPTER = textwrap.dedent(
    """
    from dataclasses import dataclass

    from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv


    @dataclass
    class Coin:
        side: str  # a dataclass of the adapter's own: needs the module in sys.modules


    class CoinEnv(TextEnv):
        default_max_steps = 1

        def task_types(self):
            return ["coin"]

        def make_task(self, seed, split):
            return EnvTask(self.name, f"{self.name}/{split}/{seed}", "coin", seed)

        def reset(self, task):
            self.coin = Coin("heads" if task.seed % 2 else "tails")
            return ResetOutcome(EnvObservation("Call it.", "Call it.", ["heads", "tails"]), "Call the coin.", "coin")

        def step(self, action):
            won = action == self.coin.side
            return StepOutcome(EnvObservation(self.coin.side, self.coin.side, []), float(won), True, won, True)


    class HalfDone(TextEnv):
        def task_types(self):
            return ["half"]
    """
)


@pytest.fixture
def adapter_file(tmp_path):
    path = tmp_path / "coin_env.py"
    path.write_text(ADAPTER)
    return path


def test_a_file_plugin_plays_and_is_imported_once(adapter_file):
    plugins = {"coin": f"{adapter_file}:CoinEnv"}
    env = make_env("coin", plugins=plugins)
    task = env.make_task(3, "train")
    assert task.env_name == "coin" and task.task_id == "coin/train/3"
    env.reset(task)
    assert env.step("heads").won
    assert env_class("coin", plugins) is type(env)  # the file ran once: one class, not a copy per call
    assert pickle.loads(pickle.dumps(env.coin)) == env.coin  # its module is importable by name
    assert type(env).__module__ in sys.modules


def test_a_module_plugin_from_the_python_path(adapter_file, monkeypatch):
    monkeypatch.syspath_prepend(str(adapter_file.parent))
    assert load_plugins({"coin": "coin_env:CoinEnv"})["coin"].__module__ == "coin_env"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:CoinEnv", "no module named 'no_such_module_xyz'"),
        ("missing/coin_env.py:CoinEnv", "no such file"),
        ("{file}:Nope", "has no class 'Nope'; it defines CoinEnv"),
        ("{file}:Coin", "'Coin' is not an env class (a subclass of actors.envs.base.TextEnv)"),
        ("{file}:HalfDone", "'HalfDone' does not implement make_task, reset, step"),
        ("{file}", "a plugin must be 'module:Class' or 'path/to/adapter.py:Class'"),
    ],
)
def test_a_bad_spec_names_itself_and_what_is_wrong(adapter_file, spec, message):
    spec = spec.format(file=adapter_file)
    with pytest.raises(PluginError) as error:
        make_env("coin", plugins={"coin": spec})
    assert str(error.value).startswith(f"plugin coin={spec}: ") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_broken_adapter_file_is_a_plugin_error(tmp_path):
    broken = tmp_path / "broken_env.py"
    broken.write_text("class Broken(:\n")
    with pytest.raises(PluginError, match=r"importing .*broken_env\.py failed: SyntaxError"):
        load_plugins({"broken": f"{broken}:Broken"})


def test_the_config_makes_plugin_files_absolute_and_names_bad_specs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(None, ["envs.plugins.coin=adapters/coin_env.py:CoinEnv", "envs.plugins.mod=pkg.mod:Env"])
    assert config.envs.plugins == {"coin": f"{tmp_path}/adapters/coin_env.py:CoinEnv", "mod": "pkg.mod:Env"}
    again = load_config(None, [f"envs.plugins={config.envs.plugins}"])  # what a Ray worker re-validates
    assert again.envs.plugins == config.envs.plugins
    with pytest.raises(ConfigError, match=r"'envs.plugins': .*plugin coin=coin_env.py: a plugin must be"):
        load_config(None, ["envs.plugins.coin=coin_env.py"])
