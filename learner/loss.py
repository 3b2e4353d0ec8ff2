"""Decoupled PPO-clip loss on response tokens (AReaL), with low-variance KL and entropy bonus.

Three policies meet here: the *behaviour* policy that sampled the tokens (an actor, possibly
several versions old), the *proximal* policy (the learner's weights before this update,
recomputed), and the current policy being optimised. The PPO ratio is taken against the
proximal policy, so the trust region is around where the learner is, not around a stale actor;
the behaviour -> proximal mismatch is corrected by an importance weight
w = pi_prox / pi_behav, and tokens with w above `behav_weight_cap` are masked out (AReaL), since
a huge weight means the sample is too off-policy to trust.

Aggregation is token-mean over the whole training batch: every term is a token *sum* divided
by `total_tokens` of the batch, so micro-batches under gradient accumulation add up to exactly
the full-batch loss and gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossTerms:
    """Loss and its parts for one micro-batch; each is sum-over-tokens / total_tokens of the batch."""

    loss: torch.Tensor  # scalar to backpropagate: pg + kl_coef * kl - entropy_coef * entropy
    pg_loss: torch.Tensor  # scalar, detached: policy-gradient (clipped surrogate) term
    kl: torch.Tensor  # scalar, detached: k3 estimate of KL(current || reference) (0 without reference)
    entropy: torch.Tensor  # scalar, detached: mean token entropy (0 when not computed)
    clip_fraction: torch.Tensor  # scalar: share of tokens where the clipped branch was taken
    approx_kl: (
        torch.Tensor
    )  # scalar: k3 estimate of KL(proximal || current), (r - 1) - log r with r = current / proximal
    behav_masked_fraction: torch.Tensor  # scalar: share of tokens masked for w > behav_weight_cap
    behav_weight: torch.Tensor  # scalar: token mean of the behaviour->proximal weight (masked tokens count 0)
    behav_abs_log_diff: torch.Tensor  # scalar: token mean of |log pi_prox - log pi_behav|: actor/learner mismatch


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log pi(token) per position: logits [..., V], tokens [...] -> [...] (float32)."""
    logits = logits.float()
    return torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution per position: logits [..., V] -> [...] (float32)."""
    logits = logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || ref) per token: r - log r - 1 with r = ref/pi; >= 0, low variance.

    Clamped to [-10, 10] as verl does, so one token where the policies disagree wildly cannot
    dominate the batch.
    """
    log_ratio = ref_logprobs - logprobs
    return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)


def ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    behav_weight_cap: float = 5.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    total_tokens: int | None = None,
) -> LossTerms:
    """Decoupled PPO-clip loss over response tokens.

    logprobs: [B, T] current policy (with grad); proximal_logprobs, behaviour_logprobs: [B, T];
    advantages: [B] per sequence (broadcast over its tokens) or [B, T]; mask: [B, T] 1 on
    response tokens; ref_logprobs: [B, T] frozen reference, needed when kl_coef > 0; entropy:
    [B, T] token entropies (with grad), needed when entropy_coef > 0; total_tokens: response
    tokens of the whole batch (defaults to this micro-batch's).
    """
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype)
    denominator = float(total_tokens if total_tokens is not None else mask.sum().item())
    denominator = max(denominator, 1.0)

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return (values * mask).sum() / denominator

    log_ratio = logprobs - proximal_logprobs.detach()
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_tokens = torch.maximum(unclipped, clipped)

    weight = (proximal_logprobs - behaviour_logprobs).detach().exp()
    kept = (weight <= behav_weight_cap).to(logprobs.dtype)
    pg_tokens = pg_tokens * weight * kept

    pg_loss = token_mean(pg_tokens)
    loss = pg_loss
    kl = torch.zeros((), dtype=logprobs.dtype)
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs from the frozen reference model")
        kl = token_mean(low_var_kl(logprobs, ref_logprobs.detach()))
        loss = loss + kl_coef * kl
    mean_entropy = torch.zeros((), dtype=logprobs.dtype)
    if entropy is not None:
        mean_entropy = token_mean(entropy)
        loss = loss - entropy_coef * mean_entropy
    elif entropy_coef > 0:
        raise ValueError("entropy_coef > 0 needs the token entropies")
    return LossTerms(
        loss=loss,
        pg_loss=pg_loss.detach(),
        kl=kl.detach(),
        entropy=mean_entropy.detach(),
        clip_fraction=token_mean((clipped > unclipped).to(logprobs.dtype)).detach(),
        approx_kl=token_mean((ratio - 1.0) - log_ratio).detach(),
        behav_masked_fraction=token_mean(1.0 - kept).detach(),
        behav_weight=token_mean(weight * kept).detach(),
        behav_abs_log_diff=token_mean((proximal_logprobs - behaviour_logprobs).abs()).detach(),
    )
