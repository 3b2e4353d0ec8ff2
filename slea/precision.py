"""Which floating-point format computes where: bfloat16 only where the hardware runs it faster.

bf16 is a win only where matrix units take it: Intel AMX (a 2048^2 matmul ~7x faster than fp32), a
CUDA device with bf16 support, and some CPUs with AVX512-BF16 (a Zen 4 EPYC: ~2x). Without those
instructions torch falls back to scalar code: on an AVX2-only CPU (AMD Zen 2, say) the same matmul
runs some hundred times *slower* in bf16 than in fp32. And the instructions are not enough: on a
2-core Xeon VM (family 6 model 207) that shows AVX512-BF16 but not AMX, bf16 ran at 0.17 TFLOP/s
against fp32's 0.33, and `slea train configs/local.yaml` took 237 s in bf16 against 196 s in fp32.
So on a CPU with the instructions `auto` measures both (`bf16_pays_on_cpu`, a fifth of a second) and
takes bf16 only where it is clearly faster. It is resolved on the machine that computes (an actor
worker, a learner rank), never on the driver that only reads the config.
"""

from __future__ import annotations

import functools
import time

import torch

BF16_MIN_SPEEDUP = 1.2  # bf16 rounds to 8 bits of mantissa: taken only where it buys at least this much speed
PROBE_SHAPE = (512, 576, 1536)  # tokens x hidden x MLP width: a prefill or learner matmul of the shipped 135M model
PROBE_ROUNDS = 5  # interleaved, best of each: a neighbour's burst of work slows one round, not the minimum


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu" or "cuda") has bf16 matrix instructions (not whether they pay)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()) or bool(
        getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
    )


def bf16_pays(float32_seconds: float, bfloat16_seconds: float) -> bool:
    """Whether the same product taking these times makes bf16 worth its precision."""
    return bfloat16_seconds * BF16_MIN_SPEEDUP <= float32_seconds


def _product_seconds(dtype: torch.dtype) -> float:
    rows, inner, columns = PROBE_SHAPE
    left, right = torch.randn(rows, inner).to(dtype), torch.randn(inner, columns).to(dtype)
    left @ right  # warm-up: oneDNN builds its kernel for the shape on the first call
    start = time.perf_counter()
    for _ in range(3):
        left @ right
    return (time.perf_counter() - start) / 3


@functools.cache
def bf16_pays_on_cpu() -> bool:
    """Times the probe product in both formats on this CPU with this process's torch threads, once
    a process (0.2 s on the 2-core Xeon above; not run without the instructions, where scalar bf16 is slow)."""
    if not native_bf16("cpu"):
        return False
    times = {dtype: float("inf") for dtype in (torch.float32, torch.bfloat16)}
    for _ in range(PROBE_ROUNDS):
        for dtype in times:
            times[dtype] = min(times[dtype], _product_seconds(dtype))
    return bf16_pays(times[torch.float32], times[torch.bfloat16])


def resolve_dtype(setting: str, device_type: str) -> str:
    """A dtype setting -> the dtype name to compute in on this device: `auto` is bfloat16 on a CUDA
    device that supports it and on a CPU where it pays (`bf16_pays_on_cpu`), else float32; any other
    setting is taken as written."""
    if setting != "auto":
        return setting
    if device_type == "cuda":
        return "bfloat16" if native_bf16("cuda") else "float32"
    return "bfloat16" if bf16_pays_on_cpu() else "float32"
