"""Generation engines behind one interface: vLLM on GPU, transformers on CPU."""

from __future__ import annotations

import torch

from actors.engines.base import Generation, GenerationEngine, SamplingSettings
from slea.precision import resolve_dtype


def make_engine(
    kind: str,
    model_name: str,
    sampling: SamplingSettings,
    *,
    dtype: str = "auto",
    max_batch: int = 8,
    engine_args: dict | None = None,
) -> GenerationEngine:
    """The engine named by `actors.engine`, loading `model.name` in `dtype` (`actors.dtype`: `auto` is
    resolved here, in the process that generates, for the device it generates on)."""
    on_gpu = kind == "vllm" and torch.cuda.is_available()  # the transformers engine generates on the CPU
    dtype = resolve_dtype(dtype, "cuda" if on_gpu else "cpu")
    if kind == "transformers":
        from actors.engines.transformers_engine import TransformersEngine

        return TransformersEngine.from_name(model_name, sampling, dtype=dtype, max_batch=max_batch)
    if kind == "vllm":
        from actors.engines.vllm_engine import VllmEngine

        return VllmEngine.from_name(model_name, sampling, dtype=dtype, engine_args=engine_args or {})
    raise ValueError(f"actors.engine '{kind}' is not one of: transformers, vllm")


__all__ = ["Generation", "GenerationEngine", "SamplingSettings", "make_engine"]
