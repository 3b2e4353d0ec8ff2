"""EDGE distillation: teach the experience-free policy what the experiences taught it, where they helped.

With A/B groups (`actors.ab_groups`) each task group plays its first half with retrieved
experiences in the prompt (A) and its second half without (B). The B-half actors still
retrieve, and record the prompt the step would have had with the experiences shown: the
*teacher prompt*. The learner then adds, on the B half's own samples y ~ pi(.|x_plain), the
reverse KL from the student pi_theta(.|x_plain) to the teacher pi_theta(.|x_teacher) (the same
weights, no gradient), as in on-policy distillation: the per-token log-ratio

    d_t = log pi_theta(y_t | x_plain, y<t) - log pi_teacher(y_t | x_teacher, y<t)

is a sampled estimate of KL(student || teacher) whose score-function gradient is
E[d_t * grad log pi_theta(y_t)]; so -coef * d_t, detached, is added to the token's advantage and
the PPO surrogate carries it (with the same behaviour weights and clipping as the task reward).
Tokens the teacher finds likelier than the student (d_t < 0) are pushed up, the others down.

The gain gate: experiences are not always good, and distilling a worse teacher would hurt, so a
group is distilled only when its A half did better than its B half by more than
`learner.edge_gain_threshold` (success rate or mean episode return, `learner.edge_gain_metric`).

Pure functions over plain data and tensors; the learner and the trainer call them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from slea.records import StepRecord

# -- the gain gate ---------------------------------------------------------------------------------


@dataclass
class EpisodeOutcome:
    """One finished episode of a group, as the gate sees it."""

    with_experience: bool  # A half (True) or B half (False)
    success: bool  # won
    episode_return: float  # sum of its step rewards


def episode_outcomes(records: list[StepRecord]) -> list[EpisodeOutcome]:
    """The episodes of one group's step records (any order), one outcome each."""
    returns: dict[str, float] = {}
    outcomes: dict[str, EpisodeOutcome] = {}
    for record in records:
        returns[record.episode_id] = returns.get(record.episode_id, 0.0) + record.reward
        if record.done:
            outcomes[record.episode_id] = EpisodeOutcome(record.with_experience, record.success, 0.0)
    for episode_id, outcome in outcomes.items():
        outcome.episode_return = returns[episode_id]
    return list(outcomes.values())


def group_gain(outcomes: list[EpisodeOutcome], metric: str = "success") -> float | None:
    """Mean score of the A half minus that of the B half; None when a half is missing (no A/B split)."""
    score = (lambda o: float(o.success)) if metric == "success" else (lambda o: o.episode_return)
    with_exp = [score(o) for o in outcomes if o.with_experience]
    without = [score(o) for o in outcomes if not o.with_experience]
    if not with_exp or not without:
        return None
    return float(np.mean(with_exp) - np.mean(without))


def distilled(gain: float | None, threshold: float) -> bool:
    """The gate: distil a group only when the experiences helped in it by more than `threshold`."""
    return gain is not None and gain > threshold


@dataclass
class EdgeSelection:
    """Which steps of a training batch are distilled, and why."""

    teacher_prompts: list[np.ndarray]  # int32 [P'] per record: its teacher prompt, empty when not distilled
    gains: list[float]  # gain of every group that had an A/B split
    groups_gated_in: int  # groups whose B half is distilled


def select_teachers(groups: list[list[StepRecord]], threshold: float, metric: str = "success") -> EdgeSelection:
    """Teacher prompts of the gated-in groups' B-half steps, aligned with the groups' records flattened."""
    teachers: list[np.ndarray] = []
    gains: list[float] = []
    gated_in = 0
    empty = np.zeros(0, dtype=np.int32)
    for records in groups:
        gain = group_gain(episode_outcomes(records), metric)
        keep = distilled(gain, threshold)
        if gain is not None:
            gains.append(gain)
        gated_in += keep
        teachers += [record.teacher_prompt_ids if keep and not record.with_experience else empty for record in records]
    return EdgeSelection(teachers, gains, gated_in)


def edge_metrics(selection: EdgeSelection, groups: int) -> dict:
    """Learner metrics of one step's gate: share of groups distilled and their mean A-minus-B gain."""
    return {
        "edge_gated_fraction": selection.groups_gated_in / groups if groups else 0.0,
        "edge_gain_mean": float(np.mean(selection.gains)) if selection.gains else 0.0,
        "edge_distilled_steps": sum(1 for teacher in selection.teacher_prompts if len(teacher)),
    }


# -- the distillation signal -------------------------------------------------------------------------


def distill_log_ratio(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """d_t = log pi_student(y_t) - log pi_teacher(y_t) on distilled tokens, 0 elsewhere; detached, [B, T].

    Its mean over distilled tokens estimates KL(student || teacher) (the sampled reverse KL)."""
    return (student_logprobs.detach().float() - teacher_logprobs.detach().float()) * mask


def distill_advantages(advantages: torch.Tensor, log_ratio: torch.Tensor, coef: float) -> torch.Tensor:
    """Per-token advantages [B, T]: the sequence advantage [B] (or [B, T]) minus coef * d_t.

    Under the policy gradient, -d_t is the per-token reward of on-policy distillation: descending
    the loss then follows -grad KL(student || teacher) on the sampled tokens."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.to(log_ratio.dtype) - coef * log_ratio
