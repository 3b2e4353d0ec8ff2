"""A Ray process that asked for no GPU never sees one.

Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone in a worker it assigned no GPU
(ray/_private/accelerators/accelerator.py, RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO), so on a GPU node
`torch.cuda.is_available()` is True in a `num_gpus: 0` actor worker, evaluator, library writer or
Serve replica. Whatever picks its device from that (the transformers engine, the MiniLM embedder,
DeepSpeed's accelerator) lands on a GPU it never reserved, beside the vLLM engines and the learner
that did, and takes memory their shares counted on.

The variable must be set before the process first touches CUDA, and a module imported before the
actor's `__init__` may already have; so it travels in the runtime env Ray starts the process
with, not in `os.environ` inside the actor. Ray merges an actor's `env_vars` with the job's
(slea/cpu_threads.py's), so both hold. A process given GPUs (`num_gpus > 0`, fractions included)
gets what Ray assigns: Ray narrows CUDA_VISIBLE_DEVICES to its GPU.
"""

from __future__ import annotations

NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}  # CUDA, and so torch, NCCL and vLLM, see no device


def gpu_options(num_gpus: float) -> dict:
    """The GPU part of a Ray actor's `.options()` (or a Serve deployment's `ray_actor_options`):
    the GPUs asked for, and with none asked for, the GPUs hidden from the process."""
    if num_gpus > 0:
        return {"num_gpus": num_gpus}
    return {"num_gpus": 0, "runtime_env": {"env_vars": dict(NO_GPU_ENV)}}
