"""Staging a weight version for vLLM's workers when shared memory is small (Docker's default
/dev/shm is 64 MiB): a real small tmpfs over /dev/shm, in a mount namespace of a subprocess of
its own (`unshare`), and the engine arguments vLLM gets on each platform."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actors.engines.vllm_engine import engine_arguments

REPO = Path(__file__).resolve().parents[3]

# Runs inside the namespace, where /dev/shm is a 1 MiB tmpfs.
PROBE = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from actors.engines.weight_staging import SHM, stage, staging_dirs, staging_tensors, write_staged

small = {"w": torch.ones(1000)}  # 4 kB
large = {"w": torch.arange(2**19, dtype=torch.float32)}  # 2 MiB: more than the 1 MiB shm
large["tied"] = large["w"]
result = {"shm_free": __import__("shutil").disk_usage(SHM).free}
for name, state in (("small", small), ("large", large)):
    path = stage(state)
    result[name] = {"dir": str(path.parent), "names": sorted(load_file(path)), "ok": bool(torch.equal(load_file(path)["w"], state["w"]))}
    path.unlink()
# The free-space check passed (or was wrong) and the write still ran out of room: the next directory.
path = write_staged(staging_tensors(large), [SHM, *staging_dirs(0, Path("/nonexistent"))])
result["write_fails"] = {"dir": str(path.parent), "shm_left": sorted(p.name for p in SHM.iterdir())}
path.unlink()
print(json.dumps(result))
"""


def _in_small_shm(code: str) -> dict:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to give a subprocess a small /dev/shm of its own")
    command = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -c '{code}'"
    result = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    if result.returncode != 0 and "mount" in result.stderr and "ermission" in result.stderr:
        pytest.skip(f"this machine lets no unprivileged mount namespace mount a tmpfs: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_a_version_too_large_for_shared_memory_goes_to_the_temp_dir():
    out = _in_small_shm(PROBE)
    assert out["shm_free"] <= 2**20
    assert out["small"] == {"dir": "/dev/shm", "names": ["w"], "ok": True}
    assert out["large"]["dir"] != "/dev/shm" and out["large"]["ok"]
    assert out["large"]["names"] == ["w"], "tied weights are staged once"
    assert out["write_fails"]["dir"] != "/dev/shm"
    assert out["write_fails"]["shm_left"] == [], "the partial file in /dev/shm was not removed"


def test_eager_only_on_cpu_and_the_logprobs_mode_is_fixed():
    gpu, gpu_env = engine_arguments({"gpu_memory_utilization": 0.45}, seed=3, on_cpu=False)
    assert "enforce_eager" not in gpu and gpu_env == {}  # CUDA graphs and compilation stay on
    assert gpu["gpu_memory_utilization"] == 0.45 and gpu["seed"] == 3
    cpu, _cpu_env = engine_arguments({}, seed=0, on_cpu=True)
    assert cpu["enforce_eager"] is True and cpu["kv_cache_memory_bytes"] == 2**30
    assert engine_arguments({"enforce_eager": True}, 0, on_cpu=False)[0]["enforce_eager"] is True  # the caller's word
    assert (
        engine_arguments({"logprobs_mode": "raw_logprobs"}, 0, on_cpu=False)[0]["logprobs_mode"] == "processed_logprobs"
    )


def test_the_cpu_engine_preloads_debians_tcmalloc_unless_told_not_to(monkeypatch):
    """scripts/setup.sh --vllm (and so --dev, CI) installs libtcmalloc-minimal4: it is on this machine."""
    from actors.engines.vllm_engine import TCMALLOC

    (library,) = sorted(Path("/").glob(TCMALLOC.lstrip("/")))
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    assert engine_arguments({}, seed=0, on_cpu=True)[1]["LD_PRELOAD"] == f"{library}:/opt/other.so"
    monkeypatch.setenv("SLEA_VLLM_TCMALLOC", "0")  # what `slea bench actors` compares against
    assert "LD_PRELOAD" not in engine_arguments({}, seed=0, on_cpu=True)[1]
    monkeypatch.delenv("SLEA_VLLM_TCMALLOC")
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libtcmalloc.so")  # the user's own: left as it is
    assert "LD_PRELOAD" not in engine_arguments({}, seed=0, on_cpu=True)[1]
    assert engine_arguments({}, seed=0, on_cpu=False)[1] == {}  # GPU: nothing preloaded
