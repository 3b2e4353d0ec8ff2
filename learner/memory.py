"""What one learner rank holds in memory, by arithmetic, before it runs.

A learner that does not fit finds out minutes into a run, with an out-of-memory error mid-step
(or, sharing a GPU with vLLM, by failing vLLM). Its memory is a sum of terms each fixed by the
config, so it can be counted first, and the count can be checked against torch's measured peak
(tests/learner/test_memory.py on CPU; scripts/gpu_check.sh and device_check.sh on a GPU).

The terms, for P parameters, N data-parallel ranks (ZeRO partitions over them) and the learner as
learner/engine.py builds it (DeepSpeed's bf16 section off: the module's parameters are float32,
bf16 is autocast; see learner/precision.py):

- weights: the module's float32 parameters, 4P (ZeRO-3 partitions them: 4P/N);
- masters: DeepSpeed's ZeRO optimizer keeps its own float32 copy of its partition, 4P/N
  (ZeRO-0 steps the module's parameters: none);
- grads: float32 gradients, 4P (ZeRO-2/3 keep only their partition: 4P/N);
- moments: AdamW's two float32 moments, 8P (ZeRO-1 and up: 8P/N);
- reference: the frozen KL reference, a full copy in its dtype (4P float32, 2P bf16, 0 without);
- activations: what backward keeps of a micro-batch's forward (below);
- logits: float32 logits of the response positions and their log-softmax and softmax (for the
  entropy), each [response tokens, vocabulary].

Activations per token and layer of a Llama/Qwen2 block with SDPA attention (no [T, T] matrix
kept), in the compute dtype's bytes b unless said: the two RMSNorms' float32 inputs (the residual
stream stays float32: 2 x 4h), their outputs (2 x b h), q, k, v and the RoPE products (b (2h + 4
h_kv)), the attention output (b h), the MLP's gate, up, SiLU(gate) and their product (4 b I).
With activation checkpointing a layer keeps only its float32 input (4h) and one layer at a time
is recomputed whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import psutil
import torch

from learner.device import memory_fraction

GIB = 1024**3
LOGIT_COPIES = 5  # forward: float32 logits, log-softmax, softmax (entropy); backward: the grads of two of them


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that set its memory."""

    params: int  # distinct parameters (a tied embedding counted once)
    hidden: int  # h: hidden size
    layers: int  # decoder layers
    intermediate: int  # I: the MLP's inner size
    kv_hidden: int  # h_kv: key/value width (kv heads x head dim)
    vocab: int  # vocabulary (logit columns)


def shape_of(model_config, params: int | None = None) -> ModelShape:
    """A transformers config's shape; `params` from the model when built, else counted from the config."""
    h, layers, inner = model_config.hidden_size, model_config.num_hidden_layers, model_config.intermediate_size
    heads = model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or h // heads
    kv = getattr(model_config, "num_key_value_heads", heads) * head_dim
    vocab = model_config.vocab_size
    if params is None:
        bias = h + 2 * kv if getattr(model_config, "attention_bias", False) or model_config.model_type == "qwen2" else 0
        per_layer = h * (h + 2 * kv) + bias + h * h + 3 * h * inner + 2 * h
        embeddings = vocab * h * (1 if model_config.tie_word_embeddings else 2)
        params = layers * per_layer + embeddings + h
    return ModelShape(params, h, layers, inner, kv, vocab)


@dataclass(frozen=True)
class LearnerMemory:
    """Bytes one learner rank holds, by term."""

    weights: int
    masters: int
    grads: int
    moments: int
    reference: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def overflow(self, budget: int) -> str | None:
        """None when the total fits `budget` bytes; else which term crosses it, with the count."""
        running = 0
        for name, size in asdict(self).items():
            running += size
            if running > budget:
                terms = ", ".join(f"{term} {value / GIB:.1f}" for term, value in asdict(self).items())
                return (
                    f"the learner needs {self.total / GIB:.1f} GiB ({terms}) and has {budget / GIB:.1f} GiB: "
                    f"it overflows at {name} ({size / GIB:.1f} GiB)"
                )
        return None


def learner_memory(
    shape: ModelShape,
    *,
    zero_stage: int,
    ranks: int = 1,
    compute_bytes: int = 2,
    reference: str = "float32",
    micro_batch_tokens: int,
    response_tokens: int | None = None,
    checkpointing: bool = False,
) -> LearnerMemory:
    """The learner's memory (module docstring). compute_bytes: 2 for bf16 autocast, 4 for float32;
    reference: "float32", "bfloat16" or "none"; response_tokens: of a micro-batch, at most all of
    its tokens (the default, the bound)."""
    p, n, b = shape.params, ranks, compute_bytes
    h, kv, inner = shape.hidden, shape.kv_hidden, shape.intermediate
    responses = micro_batch_tokens if response_tokens is None else response_tokens
    layer = 2 * 4 * h + b * (2 * h + 2 * h + 4 * kv + h + 4 * inner)  # per token (docstring)
    if checkpointing:
        activations = micro_batch_tokens * (shape.layers * 4 * h + layer)
    else:
        activations = micro_batch_tokens * shape.layers * layer
    reference_bytes = {"float32": 4, "bfloat16": 2, "none": 0}[reference]
    return LearnerMemory(
        weights=4 * p // (n if zero_stage == 3 else 1),
        masters=0 if zero_stage == 0 else 4 * p // n,
        grads=4 * p // (n if zero_stage >= 2 else 1),
        moments=8 * p // (n if zero_stage >= 1 else 1),
        reference=reference_bytes * p,
        activations=activations,
        logits=LOGIT_COPIES * 4 * responses * shape.vocab,
    )


class LearnerMemoryError(RuntimeError):
    """The learner's settings cannot fit the memory of its device."""


def reference_dtype(cfg, compute_dtype: torch.dtype) -> torch.dtype | None:
    """The frozen KL reference's dtype for `cfg` (LearnerConfig): none without the KL term; `auto`
    follows the compute dtype. The trainer holds its reference in it, and the count counts it."""
    if cfg.kl_coef == 0:
        return None
    return compute_dtype if cfg.reference_dtype == "auto" else getattr(torch, cfg.reference_dtype)


def dtype_name(dtype: torch.dtype | None) -> str:
    """ "float32", "bfloat16", ... or "none" (no tensor held)."""
    return "none" if dtype is None else str(dtype).removeprefix("torch.")


def count_for(
    model, cfg, *, world_size: int, compute_dtype: torch.dtype, longest_row: int = 0, response_tokens: int | None = None
) -> LearnerMemory:
    """The count for `model` (a transformers causal LM, built) trained with `cfg` (LearnerConfig).

    A micro-batch holds at most max(micro_batch_tokens, the longest row) padded tokens
    (learner/batch.py gives a longer row a micro-batch of its own); `longest_row` is
    model.max_prompt_tokens + model.max_new_tokens where the caller knows them. Every token is
    counted a response (the bound) unless `response_tokens` says how many of a micro-batch's are:
    its response share is not known before its rows."""
    params = sum(param.numel() for param in model.parameters())  # parameters() yields a tied weight once
    return learner_memory(
        shape_of(model.config, params),
        zero_stage=cfg.zero_stage,
        ranks=world_size,
        compute_bytes=compute_dtype.itemsize,
        reference=dtype_name(reference_dtype(cfg, compute_dtype)),
        micro_batch_tokens=max(cfg.micro_batch_tokens, longest_row),
        response_tokens=response_tokens,
        checkpointing=cfg.activation_checkpointing,
    )


def device_budget(device, num_gpus: float) -> int:
    """Bytes the learner may hold on `device` (a torch.device): its share of the GPU (the cap
    learner/device.py sets), or on the CPU the machine's memory (how much of it the actors,
    evaluator and library will take is not known at start)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * (memory_fraction(num_gpus) or 1.0))
    return psutil.virtual_memory().total


def refuse_unless_it_fits(memory: LearnerMemory, budget: int, device: str) -> None:
    """Raise, naming the term that overflows, when `memory` cannot fit `budget` bytes on `device`.

    The count is a floor (the measured peaks run above it: tests/learner/test_memory.py), so a
    setting refused here would fail minutes later with an out-of-memory error mid-step."""
    overflow = memory.overflow(budget)
    if overflow is not None:
        raise LearnerMemoryError(
            f"{overflow} on {device}. Cut it with learner.activation_checkpointing: true, "
            "learner.reference_dtype: bfloat16 (or learner.kl_coef: 0, no reference), a smaller "
            "learner.micro_batch_tokens, learner.zero_stage 0 on one rank (no master copy) or ZeRO 1-3 "
            "over more ranks (learner.num_ranks), or give the learner a larger share (learner.num_gpus)"
        )
