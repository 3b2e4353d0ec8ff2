"""The engine interface: prompt token ids in, response token ids and their log-probs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase

STOP_TEXT = "</action>"


@dataclass(frozen=True)
class SamplingSettings:
    """How responses are sampled (same meaning for every engine)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass
    max_new_tokens: int = 128  # response budget
    stop: tuple[str, ...] = (STOP_TEXT,)  # generation ends after any of these (kept in the response)


@dataclass
class Generation:
    """One sampled response, exactly as generated."""

    prompt_ids: list[int]  # [P] the ids the model was conditioned on
    response_ids: np.ndarray  # int32 [R] sampled ids, through the stop text or EOS
    logprobs: np.ndarray  # float32 [R] log-prob of each sampled id under the sampling distribution
    text: str  # decoded response
    policy_version: int  # weights version that generated it
    finish_reason: str  # "stop" (stop text or EOS) or "length"
    prefill_s: float = 0.0  # engine seconds from starting on it to its first token (transformers: the batch's)
    decode_s: float = 0.0  # engine seconds from its first token to its last (transformers: the batch's)
    cached_prompt_tokens: int = 0  # prompt tokens whose KV the engine's prefix cache held (vLLM; transformers has none)


class GenerationEngine(ABC):
    """A policy that generates; weights change only between generations, never mid-sequence."""

    name: str  # the `actors.engine` value that makes it: what the pool's summaries report
    tokenizer: PreTrainedTokenizerBase
    sampling: SamplingSettings

    @property
    @abstractmethod
    def policy_version(self) -> int:
        """Version of the weights the next generation will use."""

    @abstractmethod
    async def generate(self, prompt_ids: list[int]) -> Generation:
        """Generate one response; concurrent calls are batched by the engine."""

    @abstractmethod
    def generate_batch(self, prompts: list[list[int]]) -> list[Generation]:
        """Generate for a whole batch synchronously (benchmarks, evaluation)."""

    @abstractmethod
    def update_weights(self, state_dict: dict, version: int) -> None:
        """Stage new weights; they take effect before the next generation starts. The state dict
        names exactly the model's tensors (see `check_weight_names`)."""

    def close(self) -> None:  # noqa: B027 (a default no-op, not abstract: most need nothing)
        """Release the engine's resources."""

    async def reset_prefix_cache(self) -> None:  # noqa: B027 (a default no-op: only vLLM caches prompts)
        """Forget the KV cached for earlier prompts, so that replaying them (`slea bench actors`)
        prefills them again."""


def check_weight_names(given: Iterable[str], expected: Iterable[str], tied: Iterable[str] = ()) -> None:
    """Refuse a weight update that does not name exactly the model's tensors, before anything is
    loaded: a missing or renamed key would leave that tensor at its old value while generations
    are tagged with the new version (torch's non-strict load and vLLM's loader only warn).
    `tied` names alias another tensor (lm_head tied to the embeddings) and may be given or not."""
    tied = set(tied)
    given, expected = set(given) - tied, set(expected) - tied
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        raise ValueError(
            f"weights do not match the model, nothing was loaded: missing {_listed(missing)}, "
            f"unexpected {_listed(unexpected)} (the learner and the actors must load the same architecture)"
        )


def _listed(names: list[str], most: int = 10) -> str:
    return str(names) if len(names) <= most else f"{names[:most]} and {len(names) - most} more"
