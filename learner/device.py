"""Which device a learner rank trains on: what Ray assigned it, not what the node has.

Ray 2.60 no longer hides a node's GPUs from a worker that asked for none (it leaves
CUDA_VISIBLE_DEVICES alone when no GPU is assigned: ray/_private/accelerators/accelerator.py,
RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO), so `torch.cuda.is_available()` is True in a `num_gpus: 0`
learner on a GPU node. A learner that followed it would train on a GPU it never reserved, beside
the vLLM engines that did. So:

- a rank inside a Ray actor trains where `learner.num_gpus` says: on the GPU Ray assigned
  (`ray.get_gpu_ids()`; Ray narrows CUDA_VISIBLE_DEVICES to it, so it is usually `cuda:0`), or
  on the CPU with the GPUs hidden before torch and DeepSpeed look for them
  (`hide_unassigned_gpus`, called by learner/process.py before it imports DeepSpeed);
- a rank outside Ray (torchrun, `slea bench learner`, tests) owns what its process sees;
- `num_gpus > 0` without a usable CUDA device is an error at start-up, not a CPU run by surprise;
- a fractional `num_gpus` shares its GPU (configs/gpu.yaml: the learner and vLLM, 0.5 each).
  vLLM reserves its share (`gpu_memory_utilization`) when it starts; the learner's allocations
  are unbounded unless capped, and a learner that grows into vLLM's share fails vLLM or itself
  with an out-of-memory error mid-run. `torch.cuda.set_per_process_memory_fraction(num_gpus)`
  caps it at its share, so a config too large for its share fails in the learner, naming it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch


class DeviceError(RuntimeError):
    """The learner cannot have the device its config asks for."""


@dataclass(frozen=True)
class DevicePlan:
    """Where one learner rank trains."""

    device: str  # "cpu" or "cuda:<index>" (an index among this process's visible devices)
    memory_fraction: float | None  # share of that GPU's memory the process may allocate; None: no cap


def memory_fraction(num_gpus: float) -> float | None:
    """The memory cap of a rank that asked Ray for `num_gpus` GPUs: its share of a shared GPU."""
    return float(num_gpus) if 0 < num_gpus < 1 else None


def plan_device(
    num_gpus: float,
    cuda_available: bool,
    gpu_ids: list[str] | None,
    visible_devices: str | None,
    local_rank: int = 0,
) -> DevicePlan:
    """Decide a rank's device from plain facts.

    num_gpus: `learner.num_gpus`; cuda_available: `torch.cuda.is_available()` in this process;
    gpu_ids: `ray.get_gpu_ids()` inside a Ray actor, None outside Ray; visible_devices: the
    CUDA_VISIBLE_DEVICES this process sees (None: unset); local_rank: LOCAL_RANK outside Ray."""
    if num_gpus > 0 and not cuda_available:
        raise DeviceError(
            f"learner.num_gpus={num_gpus} but this process sees no CUDA device (torch.cuda.is_available() "
            f"is False; CUDA_VISIBLE_DEVICES={visible_devices!r}): a CPU build of torch, no NVIDIA driver, or "
            "the GPUs hidden from it. Install the CUDA build of torch on a GPU node, or set learner.num_gpus: 0"
        )
    if gpu_ids is None:  # not a Ray actor: the process owns what it sees
        if not cuda_available:
            return DevicePlan("cpu", None)
        return DevicePlan(f"cuda:{local_rank}", memory_fraction(num_gpus))
    if num_gpus == 0:
        if cuda_available:
            raise DeviceError(
                "learner.num_gpus=0 but this Ray actor sees CUDA devices (Ray 2.60 no longer hides them from a "
                "worker that asked for none), and DeepSpeed would put the model on one of them: call "
                "learner.device.hide_unassigned_gpus(0) before torch or DeepSpeed touch CUDA, as "
                "learner/process.py does, or give the learner GPUs (learner.num_gpus)"
            )
        return DevicePlan("cpu", None)
    if not gpu_ids:
        raise DeviceError(
            f"learner.num_gpus={num_gpus} but Ray assigned this actor no GPU (ray.get_gpu_ids() is empty): "
            "start the learner with .options(num_gpus=learner.num_gpus)"
        )
    visible = [device.strip() for device in (visible_devices or "").split(",") if device.strip()]
    assigned = str(gpu_ids[0])
    # Ray narrows CUDA_VISIBLE_DEVICES to the assigned ids; with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES
    # it leaves the variable as it was, and the assigned id is a position in it (or, unset, a device index).
    index = visible.index(assigned) if assigned in visible else int(assigned)
    return DevicePlan(f"cuda:{index}", memory_fraction(num_gpus))


def hide_unassigned_gpus(num_gpus: float, environ: dict | None = None) -> bool:
    """A rank that asked for no GPU sees none: CUDA_VISIBLE_DEVICES="" before anything initialises
    CUDA, so torch, DeepSpeed's accelerator and the weight push all agree on the CPU. Returns
    whether it hid them."""
    if num_gpus > 0:
        return False
    environ = os.environ if environ is None else environ
    environ["CUDA_VISIBLE_DEVICES"] = ""
    return True


def training_device(num_gpus: float) -> torch.device:
    """This rank's training device (see the module docstring); on a GPU it is made current and,
    when shared, the process's memory is capped at its share."""
    ray = sys.modules.get("ray")  # never imported to learn that this is no Ray actor (a node may not have Ray)
    in_actor = ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    plan = plan_device(
        num_gpus,
        torch.cuda.is_available(),
        [str(gpu) for gpu in ray.get_gpu_ids()] if in_actor else None,
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        int(os.environ.get("LOCAL_RANK", 0)),
    )
    device = torch.device(plan.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if plan.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(plan.memory_fraction, device)
    return device
