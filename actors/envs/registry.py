"""Environment registry: envs are created by name from the run config.

Built-in envs register themselves on import; a user adds one by writing an adapter class
(a `TextEnv` subclass) and naming it in the config (`envs.plugins: {myenv: "mypkg.mod:MyEnv"}`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from actors.envs.base import TextEnv

_REGISTRY: dict[str, type[TextEnv]] = {}

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


def register_env(name: str) -> Callable[[type[TextEnv]], type[TextEnv]]:
    def decorate(cls: type[TextEnv]) -> type[TextEnv]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def env_class(name: str, plugins: dict[str, str] | None = None) -> type[TextEnv]:
    if name in (plugins or {}):
        module_name, _, class_name = plugins[name].partition(":")
        if not class_name:
            raise UnknownEnvError(f"plugin '{name}' must be 'module:Class', got {plugins[name]!r}")
        cls = getattr(importlib.import_module(module_name), class_name)
        if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
            raise UnknownEnvError(f"plugin '{name}' ({plugins[name]}) is not a TextEnv subclass")
        cls.name = name
        return cls
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
