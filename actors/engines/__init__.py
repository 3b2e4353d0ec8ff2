"""Generation engines behind one interface: vLLM on GPU, transformers on CPU."""

from __future__ import annotations

from actors.engines.base import Generation, GenerationEngine, SamplingSettings


def make_engine(
    kind: str,
    model_name: str,
    sampling: SamplingSettings,
    *,
    dtype: str = "float32",
    max_batch: int = 8,
    engine_args: dict | None = None,
) -> GenerationEngine:
    """The engine named by `actors.engine`, loading `model.name`."""
    if kind == "transformers":
        from actors.engines.transformers_engine import TransformersEngine

        return TransformersEngine.from_name(model_name, sampling, dtype=dtype, max_batch=max_batch)
    if kind == "vllm":
        from actors.engines.vllm_engine import VllmEngine

        return VllmEngine.from_name(model_name, sampling, dtype=dtype, engine_args=engine_args or {})
    raise ValueError(f"actors.engine '{kind}' is not one of: transformers, vllm")


__all__ = ["Generation", "GenerationEngine", "SamplingSettings", "make_engine"]
