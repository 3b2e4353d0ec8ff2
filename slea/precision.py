"""Which floating-point format computes where: bfloat16 only on hardware that has it natively.

bf16 is a win only where matrix units take it: Intel AMX or AVX512-BF16 on a CPU (a 2048^2 matmul
runs ~7x faster than fp32 on AMX), a CUDA device with bf16 support. Everywhere else torch falls
back to scalar code: on an AVX2-only CPU (AMD Zen 2, say) the same matmul runs some hundred times
*slower* in bf16 than in fp32. So the defaults are `auto`: bf16 where it is native, fp32 where it
is not, resolved on the machine that computes (an actor worker, a learner rank), never on the
driver that only reads the config.
"""

from __future__ import annotations

import torch


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu" or "cuda") computes bf16 matmuls in hardware."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()) or bool(
        getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
    )


def resolve_dtype(setting: str, device_type: str) -> str:
    """A dtype setting -> the dtype name to compute in on this device: `auto` is bfloat16 where it is
    native (`native_bf16`), else float32; any other setting is taken as written."""
    if setting != "auto":
        return setting
    return "bfloat16" if native_bf16(device_type) else "float32"
