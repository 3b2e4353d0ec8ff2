"""Where the object-store transport writes a weight version for vLLM's workers to load.

The vLLM workers are other processes, so a new version goes through one safetensors file that
each of them loads (actors/engines/vllm_worker.py). Shared memory (`/dev/shm`) is the fast place
for it, but a container's is small unless the container was given more: Docker's default is
64 MiB (`docker run --shm-size 8g` or `--ipc=host` raise it; Kubernetes pods get a
memory-backed emptyDir, deploy/k8s), against ~3.5 GB for Qwen2.5-1.5B in fp32 (~3.1 GB in
bf16). A write that runs out of room there fails halfway; so the file goes to /dev/shm only
when it has room for it, else (or when the write fails all the same) to the temp dir, which is
on disk: slower, but the version arrives.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

SHM = Path("/dev/shm")
HEADER_ROOM = 2**16  # safetensors' JSON header (~30 kB for a 1.5B model) and the last page, beyond the tensor bytes


def staging_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict as contiguous CPU tensors, tied weights once (vLLM ties them itself)."""
    tensors, seen = {}, set()
    for name, tensor in state_dict.items():
        if tensor.data_ptr() in seen:  # tied weights (lm_head = embeddings)
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().to("cpu").contiguous()
    return tensors


def staging_dirs(nbytes: int, shm: Path = SHM) -> list[Path]:
    """Where to try to write `nbytes` of tensors, in order: shared memory if it has room, then the temp dir."""
    dirs = []
    if shm.is_dir() and shutil.disk_usage(shm).free >= nbytes + HEADER_ROOM:
        dirs.append(shm)
    dirs.append(Path(tempfile.gettempdir()))
    return dirs


def write_staged(tensors: dict[str, torch.Tensor], dirs: list[Path]) -> Path:
    """Write `tensors` to a new safetensors file in the first of `dirs` where the write succeeds;
    the caller deletes it. A partial file is removed before the next directory is tried."""
    failures = []
    for directory in dirs:
        handle, path = tempfile.mkstemp(prefix="slea-weights-", suffix=".safetensors", dir=directory)
        os.close(handle)
        try:
            save_file(tensors, path)
            return Path(path)
        except (OSError, SafetensorError) as error:  # out of room: safetensors reports ENOSPC as its own error
            os.unlink(path)
            failures.append(f"{directory}: {error}")
    nbytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    raise OSError(
        f"could not stage a weight version of {nbytes / 2**20:.0f} MiB for vLLM ({'; '.join(failures)}): give "
        "the container more shared memory (docker run --shm-size 8g, or --ipc=host) or free the temp dir"
    )


def stage(state_dict: dict[str, torch.Tensor], shm: Path = SHM) -> Path:
    """A safetensors file of `state_dict` for vLLM's workers (see the module docstring for where)."""
    tensors = staging_tensors(state_dict)
    nbytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    return write_staged(tensors, staging_dirs(nbytes, shm))
