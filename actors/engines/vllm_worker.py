"""Runs inside each vLLM worker process (vLLM imports it by name as `worker_extension_cls`)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from actors.engines.base import check_weight_names
from slea.weight_group import WeightGroup, join_store, receive_weights


class WeightLoader:
    """Mixed into vLLM's worker: load a learner state dict in place through vLLM's own reload
    path, which maps names (fused qkv / gate_up projections) and redoes the backend's weight
    processing (the CPU backend repacks linear weights after loading).

    Two ways in: `slea_load_weights` (a safetensors file in shared memory, the object-store
    transport) and `slea_receive_weights` (a broadcast from the learner on the group joined by
    `slea_init_weight_group`, the collective transport; see slea/weight_group.py).

    Either way the names are checked first: vLLM's loader only warns about a parameter no weight
    was given for, and skips unknown names ending in `.bias`, so a renamed or missing key would
    otherwise leave that tensor at its old value."""

    def slea_load_weights(self, path: str) -> int:
        return self._slea_reload(list(load_file(path, device="cpu").items()))

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
        return self._slea_reload(receive_weights(group, plan))

    def slea_close_weight_group(self) -> None:
        group = getattr(self, "_slea_weight_group", None)
        if group is not None:
            group.close()
        self._slea_weight_group = None

    def _slea_reload(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Load learner weights (transformers names) in place, if they name exactly the model's tensors."""
        expected, tied = self._slea_weight_names()
        check_weight_names((name for name, _tensor in named_tensors), expected, tied)
        self.reload_weights(weights_iterator=iter(named_tensors))
        self._refresh_tied_head()
        return len(named_tensors)

    def _slea_weight_names(self) -> tuple[frozenset[str], frozenset[str]]:
        names = getattr(self, "_slea_names", None)
        if names is None:
            names = self._slea_names = learner_weight_names(self.model_config.hf_config)
        return names

    @torch.no_grad()
    def _refresh_tied_head(self) -> None:
        """With tied embeddings the reload skips `lm_head`, so the backend never re-derives the
        head's processed form (vLLM CPU keeps a packed copy in `cpu_linear`): redo it from the new
        table, or generation would go on with the old head."""
        model = self.model_runner.get_model()  # unwrapped: with CUDA graphs `.model` is a CUDAGraphWrapper
        head = getattr(model, "lm_head", None)
        if head is None or not getattr(model.config, "tie_word_embeddings", False):
            return
        table = model.model.embed_tokens.weight
        if head.weight.data_ptr() != table.data_ptr():
            head.weight.copy_(table)
        quant_method = getattr(head, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(head)


def learner_weight_names(hf_config) -> tuple[frozenset[str], frozenset[str]]:
    """(every tensor name of the model `hf_config` describes as the learner's transformers model
    names it, the tied aliases among them), from that model built on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    first: dict[int, str] = {}
    tied = {
        name
        for name, parameter in model.named_parameters(remove_duplicate=False)
        if first.setdefault(id(parameter), name) != name
    }
    return frozenset(model.state_dict()), frozenset(tied)
