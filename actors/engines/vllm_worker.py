"""Runs inside each vLLM worker process (vLLM imports it by name as `worker_extension_cls`)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from slea.weight_group import WeightGroup, join_store, receive_weights


class WeightLoader:
    """Mixed into vLLM's worker: load a learner state dict in place through vLLM's own reload
    path, which maps names (fused qkv / gate_up projections) and redoes the backend's weight
    processing (the CPU backend repacks linear weights after loading).

    Two ways in: `slea_load_weights` (a safetensors file in shared memory, the object-store
    transport) and `slea_receive_weights` (a broadcast from the learner on the group joined by
    `slea_init_weight_group`, the collective transport; see slea/weight_group.py)."""

    def slea_load_weights(self, path: str) -> int:
        tensors = load_file(path, device="cpu")
        self.reload_weights(weights_iterator=iter(tensors.items()))
        self._refresh_tied_head()
        return len(tensors)

    def slea_init_weight_group(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> dict:
        """Join the learner's group as rank 1 + this worker's rank (the learner is rank 0)."""
        self.slea_close_weight_group()
        device = self.device if backend == "nccl" else torch.device("cpu")
        store = join_store(host, port, world_size, timeout_s)
        self._slea_weight_group = WeightGroup(store, 1 + self.rank, world_size, backend, timeout_s, device)
        return {"rank": 1 + self.rank, "dtype": str(self.model_config.dtype).removeprefix("torch.")}

    def slea_receive_weights(self, plan: list[dict]) -> int:
        """Receive every bucket of `plan` from the learner, then load them all in place."""
        group = getattr(self, "_slea_weight_group", None)
        if group is None:
            raise RuntimeError("no weight group: the learner must call slea_init_weight_group first")
        received = receive_weights(group, plan)
        self.reload_weights(weights_iterator=((name, tensor) for name, tensor in received))
        self._refresh_tied_head()
        return len(received)

    def slea_close_weight_group(self) -> None:
        group = getattr(self, "_slea_weight_group", None)
        if group is not None:
            group.close()
        self._slea_weight_group = None

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
