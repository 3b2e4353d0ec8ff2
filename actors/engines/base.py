"""The engine interface: prompt token ids in, response token ids and their log-probs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
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


class GenerationEngine(ABC):
    """A policy that generates; weights change only between generations, never mid-sequence."""

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
        """Stage new weights; they take effect before the next generation starts."""

    def close(self) -> None:
        """Release the engine's resources."""
