"""Runs inside each vLLM worker process (vLLM imports it by name as `worker_extension_cls`)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file


class WeightLoader:
    """Mixed into vLLM's worker: load a learner state dict in place through vLLM's own reload
    path, which maps names (fused qkv / gate_up projections) and redoes the backend's weight
    processing (the CPU backend repacks linear weights after loading)."""

    def slea_load_weights(self, path: str) -> int:
        tensors = load_file(path, device="cpu")
        self.reload_weights(weights_iterator=iter(tensors.items()))
        self._refresh_tied_head()
        return len(tensors)

    @torch.no_grad()
    def _refresh_tied_head(self) -> None:
        """With tied embeddings the reload skips `lm_head`, so the backend never re-derives the
        head's processed form (vLLM CPU keeps a packed copy in `cpu_linear`): redo it from the new
        table, or generation would go on with the old head."""
        model = self.model_runner.model
        head = getattr(model, "lm_head", None)
        if head is None or not getattr(model.config, "tie_word_embeddings", False):
            return
        table = model.model.embed_tokens.weight
        if head.weight.data_ptr() != table.data_ptr():
            head.weight.copy_(table)
        quant_method = getattr(head, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(head)
