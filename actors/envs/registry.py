"""Environment registry: envs are created by name from the run config.

Built-in envs register themselves on import; a user adds one by writing an adapter class
(a `TextEnv` subclass) and naming it as a plugin, in the config (`envs.plugins: {myenv:
"mypkg.mod:MyEnv"}`) or on the command line (`--plugin myenv=path/to/adapter.py:MyEnv`): a
module on the Python path, or a single file imported by its path (docs/adding-an-env.md).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from actors.envs.base import TextEnv
from slea.config import parse_plugin_spec

_REGISTRY: dict[str, type[TextEnv]] = {}
_PLUGIN_FILES: dict[Path, ModuleType] = {}  # adapter files imported so far: a file runs once per process

# name -> module that registers it, imported on first use so that `slea --help` stays fast
_BUILTIN_MODULES = {
    "alfworld": "actors.envs.alfworld",
    "webshop": "actors.envs.webshop",
    "search_qa": "actors.envs.search_qa",
    "textworld": "actors.envs.textworld_games",
    "frozenlake": "actors.envs.frozenlake",
    "sokoban": "actors.envs.sokoban",
}


class UnknownEnvError(KeyError):
    """An env name that is neither built in nor given as a plugin."""

    def __str__(self) -> str:
        return self.args[0]


class PluginError(UnknownEnvError):
    """A plugin spec that does not lead to an env class: no such module or file, no such class, not a TextEnv."""


def register_env(name: str) -> Callable[[type[TextEnv]], type[TextEnv]]:
    def decorate(cls: type[TextEnv]) -> type[TextEnv]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _import_file(path: Path) -> ModuleType:
    """Import an adapter file by its path, under a name of its own (the file's stem and a hash of its
    path, so two adapter.py files never collide), registered in sys.modules so that dataclasses and
    pickle find its classes."""
    if path in _PLUGIN_FILES:
        return _PLUGIN_FILES[path]
    module_name = f"slea_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(module_name, path))
    sys.modules[module_name] = module
    try:
        module.__spec__.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    _PLUGIN_FILES[path] = module
    return module


def _plugin_module(name: str, spec: str, source: str, is_file: bool) -> ModuleType:
    """The module a plugin names. An ImportError from inside it (a dependency of the adapter that is
    missing here) propagates as it is: the spec is right, the env is just not available here."""
    if is_file:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plugin {name}={spec}: no such file {path}")
        try:
            return _import_file(path)
        except ImportError:
            raise
        except Exception as error:  # a syntax error or a failing top-level statement of the adapter
            raise PluginError(
                f"plugin {name}={spec}: importing {path} failed: {type(error).__name__}: {error}"
            ) from None
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as error:
        if error.name is None or not (source == error.name or source.startswith(error.name + ".")):
            raise  # the module exists; something it imports does not
        raise PluginError(
            f"plugin {name}={spec}: no module named '{source}' (install it, put it on PYTHONPATH, "
            f"or give its file: {name}=path/to/adapter.py:{spec.rpartition(':')[2]})"
        ) from None


def _is_env_class(value: object) -> bool:
    return inspect.isclass(value) and issubclass(value, TextEnv) and not inspect.isabstract(value)


def plugin_class(name: str, spec: str) -> type[TextEnv]:
    """The TextEnv subclass `spec` ('module:Class' or 'path/to/adapter.py:Class') names, registered as `name`."""
    try:
        source, class_name, is_file = parse_plugin_spec(spec)
    except ValueError as error:
        raise PluginError(f"plugin {name}={spec}: {error}") from None
    module = _plugin_module(name, spec, source, is_file)
    cls = getattr(module, class_name, None)
    if cls is None:
        envs = [n for n, value in vars(module).items() if _is_env_class(value)]
        found = f"; it defines {', '.join(envs)}" if envs else "; it defines no TextEnv subclass"
        raise PluginError(f"plugin {name}={spec}: {source} has no class '{class_name}'{found}")
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise PluginError(
            f"plugin {name}={spec}: '{class_name}' is not an env class (a subclass of actors.envs.base.TextEnv)"
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise PluginError(f"plugin {name}={spec}: '{class_name}' does not implement {missing}")
    cls.name = name
    return cls


def load_plugins(plugins: dict[str, str] | None) -> dict[str, type[TextEnv]]:
    """Every plugin's class: a command calls it first, so a bad spec fails before anything starts."""
    return {name: plugin_class(name, spec) for name, spec in (plugins or {}).items()}


def env_class(name: str, plugins: dict[str, str] | None = None) -> type[TextEnv]:
    if name in (plugins or {}):
        return plugin_class(name, plugins[name])
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in _REGISTRY:
        known = sorted(set(_BUILTIN_MODULES) | set(_REGISTRY) | set(plugins or {}))
        raise UnknownEnvError(f"unknown env '{name}'; known envs: {', '.join(known)}")
    return _REGISTRY[name]


def make_env(
    name: str, params: dict[str, Any] | None = None, max_steps: int | None = None, plugins: dict[str, str] | None = None
) -> TextEnv:
    return env_class(name, plugins)(params=params, max_steps=max_steps)


def builtin_env_names() -> list[str]:
    return list(_BUILTIN_MODULES)
