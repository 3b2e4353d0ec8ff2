"""Mixed precision for the learner: bf16 compute over float32 weights, a float32 LM head.

The parameters the optimizer steps are always float32 (they are the master weights, and AdamW's
moments are float32 beside them); only the forward and backward compute in bf16, under
`torch.autocast`. Two places stay float32 whatever the compute dtype:
- the LM head and everything after it. A bf16 head rounds logits in [16, 32) to steps of 0.125,
  which moves a token's log-prob by up to ~0.06 and the PPO ratio with it; the ratio and the
  behaviour weight are exponentials of log-prob differences, so the head runs outside autocast
  (`FloatHead`) and the log-softmax reads float32 logits (learner/loss.py).
- gradients and their accumulation over micro-batches: they have the parameters' dtype.

Why an outer `torch.autocast` *and* DeepSpeed's `torch_autocast` section (learner/engine.py):
DeepSpeed 0.19 wraps its engine's forward in `autocast_if_enabled`, which asks
`torch.is_autocast_enabled()`: with no device argument that reports CUDA's flag only. On a GPU
an outer autocast with DeepSpeed's section off is therefore switched *off* inside the engine
(it logs one warning and computes in float32); on a CPU DeepSpeed never sees an outer autocast and
leaves it alone. With the section on, DeepSpeed enters the same autocast itself on both devices,
and the outer one still covers the forwards outside the engine (the frozen reference). The
section's `lower_precision_safe_modules` is left empty so that ZeRO keeps reducing and gathering
float32 gradients and weights (DeepSpeed would otherwise move Linear layers' in bf16).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


class FloatHead(torch.nn.Linear):
    """The LM head in float32 under any autocast: same parameters (and state-dict keys) as the
    `nn.Linear` it replaces, float32 logits from float32 hidden states."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(hidden.float(), self.weight.float(), bias)


def use_float_head(model: torch.nn.Module) -> None:
    """Make `model`'s LM head a `FloatHead` in place (a class change: the weights, their tying to
    the embeddings and the state-dict keys stay as they are)."""
    head = model.get_output_embeddings()
    if type(head) not in (torch.nn.Linear, FloatHead):
        raise TypeError(
            f"the learner computes the LM head in float32 and knows a plain nn.Linear head; "
            f"{type(model).__name__} has a {type(head).__name__}"
        )
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(model.config, name, None):
            raise TypeError(f"{type(model).__name__} post-processes its logits ({name}); the learner's head does not")
    head.__class__ = FloatHead


def compute_context(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The autocast every learner forward runs under (a no-op for float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def deepspeed_autocast_section(dtype: torch.dtype) -> dict:
    """DeepSpeed's `torch_autocast` section for this compute dtype (see the module docstring)."""
    if dtype == torch.float32:
        return {"enabled": False}
    return {"enabled": True, "dtype": str(dtype).removeprefix("torch."), "lower_precision_safe_modules": []}
