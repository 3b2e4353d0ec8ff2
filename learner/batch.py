"""Training samples and their packing into token-budget micro-batches.

A sample is one step's (prompt, response) with its advantage; the learner trains on the
response tokens only. Micro-batches are left-padded so every sequence ends at the last
position: then the logits that predict the responses are the last R_max + 1 positions of every
row, and the model computes the vocabulary projection for those positions only
(`logits_to_keep`), which is most of the memory of a step on long prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TrainSample:
    """One step to train on."""

    prompt_ids: np.ndarray  # int32 [P]: the exact prompt tokens the actor generated from
    response_ids: np.ndarray  # int32 [R]: the sampled response tokens (the ones trained on)
    behaviour_logprobs: np.ndarray  # float32 [R]: log-probs of the response under the behaviour policy
    advantage: float  # SLEA advantage of the step, shared by all its response tokens
    policy_version: int  # version of the weights that generated it (for staleness metrics)
    teacher_prompt_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # int32 [P']: EDGE
    # distillation: the prompt with the experiences shown, whose log-probs the response is pulled toward; empty: none

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class MicroBatch:
    """Left-padded tensors of a few samples, sized by the token budget."""

    input_ids: torch.Tensor  # long [B, T]: pad..., prompt, response
    attention_mask: torch.Tensor  # long [B, T]: 0 on left padding
    position_ids: torch.Tensor  # long [B, T]: 0.. from the first real token (as generation numbers them)
    response_ids: torch.Tensor  # long [B, Rmax]: responses right-aligned in the last Rmax slots
    response_mask: torch.Tensor  # float [B, Rmax]: 1 on real response tokens
    behaviour_logprobs: torch.Tensor  # float [B, Rmax]: behaviour log-probs, aligned with response_ids
    advantages: torch.Tensor  # float [B]: one advantage per sample
    tokens: int  # real (non-pad) tokens, prompt + response, for throughput


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group sample indices so that (rows x longest row) stays within `token_budget`.

    Samples are sorted by length first so that rows of a micro-batch pad little; a sample
    longer than the budget gets a micro-batch of its own rather than being cut.
    """
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    plan: list[list[int]] = []
    current: list[int] = []
    for index in order:
        if current and (len(current) + 1) * lengths[index] > token_budget:
            plan.append(current)
            current = []
        current.append(index)
    if current:
        plan.append(current)
    return plan


def ppo_schedule(rows: int, mini_batches: int, epochs: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """How PPO steps through one learner batch: (the mini-batches as row indices, the order of the
    optimizer steps as indices into them).

    The rows are dealt by a seeded permutation into `mini_batches` parts whose sizes differ by at
    most one (fewer parts when there are fewer rows). Rows, not task groups, are dealt, as verl
    splits its batch (`ppo_mini_batch_size`): with one task group per learner step there would be
    nothing to split. Membership is kept across epochs (so each micro-batch is scored once, before
    the first update); every epoch after the first visits the mini-batches in a new order."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(rows)
    parts = [part.tolist() for part in np.array_split(order, min(mini_batches, rows)) if len(part)]
    steps = list(range(len(parts)))
    for _ in range(epochs - 1):
        steps += rng.permutation(len(parts)).tolist()
    return parts, steps


def collate(samples: list[TrainSample], pad_id: int, device: torch.device | str = "cpu") -> MicroBatch:
    """Left-pad samples into one MicroBatch on `device`."""
    total = max(sample.length for sample in samples)
    width = max(len(sample.response_ids) for sample in samples)
    rows = len(samples)
    input_ids = np.full((rows, total), pad_id, dtype=np.int64)
    attention_mask = np.zeros((rows, total), dtype=np.int64)
    position_ids = np.zeros((rows, total), dtype=np.int64)
    response_ids = np.full((rows, width), pad_id, dtype=np.int64)
    response_mask = np.zeros((rows, width), dtype=np.float32)
    behaviour = np.zeros((rows, width), dtype=np.float32)
    for row, sample in enumerate(samples):
        tokens = np.concatenate([sample.prompt_ids, sample.response_ids])
        input_ids[row, total - len(tokens) :] = tokens
        attention_mask[row, total - len(tokens) :] = 1
        position_ids[row, total - len(tokens) :] = np.arange(len(tokens))
        length = len(sample.response_ids)
        if length:
            response_ids[row, width - length :] = sample.response_ids
            response_mask[row, width - length :] = 1.0
            behaviour[row, width - length :] = sample.behaviour_logprobs
    as_tensor = lambda array: torch.from_numpy(array).to(device)  # noqa: E731
    return MicroBatch(
        input_ids=as_tensor(input_ids),
        attention_mask=as_tensor(attention_mask),
        position_ids=as_tensor(position_ids),
        response_ids=as_tensor(response_ids),
        response_mask=as_tensor(response_mask),
        behaviour_logprobs=as_tensor(behaviour),
        advantages=torch.tensor([sample.advantage for sample in samples], dtype=torch.float32, device=device),
        tokens=int(attention_mask.sum()),
    )


def response_logits(model: torch.nn.Module, batch: MicroBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logits [B, Rmax, V] predicting each response slot (position t predicts token t + 1), divided
    by the sampling temperature: the policy being trained is the distribution the actors sampled
    from, so its log-probs must be comparable with the recorded behaviour log-probs."""
    width = batch.response_ids.shape[1]
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=width + 1,
        use_cache=False,
    )
    logits = output.logits[:, :-1].float()  # float32 before the temperature (a bf16 quotient rounds)
    return logits if temperature == 1.0 else logits / temperature
