"""CPU generation with transformers: batched, left-padded, stop on `</action>` or EOS.

Concurrent `generate` calls from an actor's environments are gathered into one batched
`model.generate` (the CPU stand-in for vLLM's continuous batching), run in a thread so the
event loop keeps stepping environments meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from actors.batching import MicroBatcher
from actors.engines.base import Generation, GenerationEngine, SamplingSettings, check_weight_names
from slea.models import load_model


class TransformersEngine(GenerationEngine):
    name = "transformers"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingSettings,
        *,
        max_batch: int = 8,
        version: int = 0,
        seed: int = 0,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.max_batch = max_batch
        self._version = version
        self._staged: tuple[dict, int] | None = None
        self._weight_names = frozenset(model.state_dict())  # what a weight update must name, exactly
        self._lock = threading.Lock()  # one generate at a time; weights swap between them
        self._batcher = MicroBatcher(lambda prompts: asyncio.to_thread(self.generate_batch, prompts), max_batch)
        torch.manual_seed(seed)  # HF generate samples from the global generator
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_name(cls, name: str, sampling: SamplingSettings, *, dtype: str = "float32", max_batch: int = 8):
        model, tokenizer = load_model(name, dtype)
        return cls(model, tokenizer, sampling, max_batch=max_batch)

    @property
    def policy_version(self) -> int:
        return self._version

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Stage `state_dict` if it names every parameter and persistent buffer of the model and
        nothing else (the learner sends its full state dict, tied lm_head included)."""
        check_weight_names(state_dict, self._weight_names)
        with self._lock:
            self._staged = (state_dict, version)

    def _apply_staged_weights(self) -> None:
        if self._staged is not None:
            state_dict, version = self._staged
            self.model.load_state_dict(state_dict, strict=True)
            self._version, self._staged = version, None

    # -- synchronous batch -------------------------------------------------------------------

    def generate_batch(self, prompts: list[list[int]]) -> list[Generation]:
        with self._lock:
            self._apply_staged_weights()
            return self._generate_locked(prompts)

    @torch.inference_mode()
    def _generate_locked(self, prompts: list[list[int]]) -> list[Generation]:
        width = max(len(prompt) for prompt in prompts)
        pad = self.tokenizer.pad_token_id
        device = self.model.device  # a CUDA model (the device check) takes its inputs there
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device
        )
        greedy = self.sampling.temperature <= 0
        clock = _FirstTokenClock()
        started = time.perf_counter()
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else self.sampling.temperature,
            top_p=None if greedy else self.sampling.top_p,
            top_k=None,
            max_new_tokens=self.sampling.max_new_tokens,
            stop_strings=list(self.sampling.stop) or None,
            tokenizer=self.tokenizer,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
            logits_processor=LogitsProcessorList([clock]),
        )
        timing = {"prefill_s": clock.first - started, "decode_s": time.perf_counter() - clock.first}
        new_tokens = output.sequences[:, width:]
        scale = 1.0 if greedy else self.sampling.temperature
        logits = torch.stack(output.logits, dim=1).float() / scale  # [B, T, V]
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1).cpu()
        return [
            self._finish(prompt, new_tokens[row].tolist(), token_logprobs[row].numpy(), timing)
            for row, prompt in enumerate(prompts)
        ]

    def _finish(self, prompt: list[int], tokens: list[int], logprobs: np.ndarray, timing: dict) -> Generation:
        """Cut a row at its end: EOS (kept) or the end of the token completing a stop text."""
        end, reason = len(tokens), "length"
        eos = self.tokenizer.eos_token_id
        if eos in tokens:
            end, reason = tokens.index(eos) + 1, "stop"
        stop_end = self._stop_end(tokens[:end])
        if stop_end is not None:
            end, reason = stop_end, "stop"
        response = tokens[:end]
        return Generation(
            prompt_ids=list(prompt),
            response_ids=np.asarray(response, dtype=np.int32),
            logprobs=np.asarray(logprobs[:end], dtype=np.float32),
            text=self.tokenizer.decode(response, skip_special_tokens=True),
            policy_version=self._version,
            finish_reason=reason,
            **timing,
        )

    def _stop_end(self, tokens: list[int]) -> int | None:
        """Smallest prefix length whose text contains a stop text (binary search: containment is monotone)."""
        decode = self.tokenizer.decode
        if not any(stop in decode(tokens) for stop in self.sampling.stop):
            return None
        low, high = 1, len(tokens)
        while low < high:
            middle = (low + high) // 2
            if any(stop in decode(tokens[:middle]) for stop in self.sampling.stop):
                high = middle
            else:
                low = middle + 1
        return low

    # -- asynchronous, batched across callers --------------------------------------------------

    async def generate(self, prompt_ids: list[int]) -> Generation:
        return await self._batcher.submit(prompt_ids)

    def close(self) -> None:
        self._batcher.close()


class _FirstTokenClock(LogitsProcessor):
    """Notes when `generate` first asks for the next token's scores: the prompt's forward (the
    prefill) is done then, and every later token is decode. Leaves the scores as they are."""

    def __init__(self):
        self.first: float | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.first is None:
            self.first = time.perf_counter()
        return scores
