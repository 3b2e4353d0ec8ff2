"""Decoupled PPO loss against hand-computed values (torchtune style)."""

import math

import pytest
import torch

from learner.loss import gather_logprobs, low_var_kl, ppo_loss, token_entropy


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_ratio_one_zero_advantage_gives_zero_gradient():
    logprobs = _leaf([[-1.0, -2.0, -0.5]])
    same = logprobs.detach().clone()
    terms = ppo_loss(logprobs, same, same, torch.zeros(1, dtype=torch.float64), torch.ones(1, 3))
    terms.loss.backward()
    assert terms.loss.item() == 0.0
    assert torch.count_nonzero(logprobs.grad) == 0


def test_on_policy_gradient_is_minus_advantage_over_tokens():
    # ratio 1, advantage 2 on 4 tokens: d/dlogp of -A * ratio / 4 = -0.5 per token.
    logprobs = _leaf([[-1.0, -1.0, -1.0, -1.0]])
    same = logprobs.detach().clone()
    terms = ppo_loss(logprobs, same, same, torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 4))
    terms.loss.backward()
    assert terms.pg_loss.item() == pytest.approx(-2.0)
    torch.testing.assert_close(logprobs.grad, torch.full((1, 4), -0.5, dtype=torch.float64))


def test_clipping_bites_where_it_should():
    # Four tokens against the proximal policy, asymmetric clip [0.8, 1.28]:
    #   A=+1, r=1.5 -> clipped at 1.28: loss -1.28, no gradient
    #   A=+1, r=0.5 -> unclipped:        loss -0.5,  gradient -0.5/4
    #   A=-1, r=0.5 -> clipped at 0.8:   loss +0.8,  no gradient
    #   A=-1, r=1.5 -> unclipped:        loss +1.5,  gradient +1.5/4
    proximal = torch.zeros(1, 4, dtype=torch.float64)
    logprobs = _leaf([[math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5)]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    terms = ppo_loss(logprobs, proximal, proximal, advantages, torch.ones(1, 4))
    terms.loss.backward()
    assert terms.pg_loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5) / 4)
    assert terms.clip_fraction.item() == pytest.approx(0.5)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.5 / 4, 0.0, 1.5 / 4]], dtype=torch.float64))


def test_clip_high_is_asymmetric():
    # r = 1.25 with A > 0 sits inside [0.8, 1.28] (not clipped), but beyond a symmetric 0.2.
    logprobs = _leaf([[math.log(1.25)]])
    zero = torch.zeros(1, 1, dtype=torch.float64)
    terms = ppo_loss(logprobs, zero, zero, torch.ones(1, dtype=torch.float64), torch.ones(1, 1))
    assert terms.clip_fraction.item() == 0.0
    symmetric = ppo_loss(logprobs, zero, zero, torch.ones(1, dtype=torch.float64), torch.ones(1, 1), clip_high=0.2)
    assert symmetric.clip_fraction.item() == 1.0 and symmetric.pg_loss.item() == pytest.approx(-1.2)


def test_decoupled_weights_for_stale_steps():
    # Ratio 1 against the proximal policy; behaviour -> proximal weights 2, 0.5 and 10 (> cap 5).
    # pg per token = -A * w: -2, -0.5, masked; gradient per token = -A * w / 3.
    proximal = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    behaviour = proximal - torch.tensor([[math.log(2.0), math.log(0.5), math.log(10.0)]], dtype=torch.float64)
    logprobs = _leaf(proximal.tolist())
    terms = ppo_loss(
        logprobs, proximal, behaviour, torch.ones(1, dtype=torch.float64), torch.ones(1, 3), behav_weight_cap=5.0
    )
    terms.loss.backward()
    assert terms.pg_loss.item() == pytest.approx((-2.0 - 0.5) / 3)
    assert terms.behav_masked_fraction.item() == pytest.approx(1 / 3)
    # The actor/learner gap counts every token, masked ones too: (ln 2 + ln 2 + ln 10) / 3.
    assert terms.behav_abs_log_diff.item() == pytest.approx((2 * math.log(2.0) + math.log(10.0)) / 3)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-2.0 / 3, -0.5 / 3, 0.0]], dtype=torch.float64))


def test_mask_and_total_tokens_make_micro_batches_add_up():
    # Padding tokens (mask 0) contribute nothing; two micro-batches with total_tokens = 3
    # give the same loss and gradient as the whole batch at once.
    logprobs = _leaf([[-1.0, -2.0], [-0.5, -9.0]])
    behaviour = torch.tensor([[-1.2, -1.9], [-0.4, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    whole = ppo_loss(logprobs, logprobs, behaviour, advantages, mask)
    whole.loss.backward()
    whole_grad = logprobs.grad.clone()
    logprobs.grad = None
    parts = [
        ppo_loss(
            logprobs[i : i + 1],
            logprobs[i : i + 1],
            behaviour[i : i + 1],
            advantages[i : i + 1],
            mask[i : i + 1],
            total_tokens=3,
        )
        for i in range(2)
    ]
    sum(part.loss for part in parts).backward()
    assert sum(part.loss.item() for part in parts) == pytest.approx(whole.loss.item())
    torch.testing.assert_close(logprobs.grad, whole_grad)
    assert whole_grad[1, 1] == 0.0


def test_low_var_kl_k3():
    # ref/pi = 2: 2 - ln 2 - 1 = 0.306853; identical policies give 0.
    value = low_var_kl(torch.tensor([0.0, -1.0]), torch.tensor([math.log(2.0), -1.0]))
    torch.testing.assert_close(value, torch.tensor([1.0 - math.log(2.0), 0.0]))


def test_kl_and_entropy_terms_enter_the_loss():
    logprobs = _leaf([[0.0, 0.0]])
    ref = torch.tensor([[math.log(2.0), 0.0]], dtype=torch.float64)
    entropy = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    terms = ppo_loss(
        logprobs,
        logprobs,
        logprobs,
        torch.zeros(1, dtype=torch.float64),
        torch.ones(1, 2),
        ref_logprobs=ref,
        kl_coef=0.5,
        entropy=entropy,
        entropy_coef=0.1,
    )
    assert terms.kl.item() == pytest.approx((1.0 - math.log(2.0)) / 2)
    assert terms.entropy.item() == pytest.approx(2.0)
    assert terms.loss.item() == pytest.approx(0.5 * terms.kl.item() - 0.1 * 2.0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        ppo_loss(logprobs, logprobs, logprobs, torch.zeros(1), torch.ones(1, 2), kl_coef=0.1)


def test_gather_logprobs_and_entropy_of_uniform():
    logits = torch.zeros(1, 2, 4)
    torch.testing.assert_close(gather_logprobs(logits, torch.tensor([[0, 3]])), torch.full((1, 2), -math.log(4.0)))
    torch.testing.assert_close(token_entropy(logits), torch.full((1, 2), math.log(4.0)))


def test_approx_kl_is_k3_of_the_ratio_to_the_proximal_policy():
    proximal = torch.log(torch.tensor([[0.5, 0.25]]))
    current = proximal + torch.log(torch.tensor([[1.2, 0.5]]))  # ratios 1.2 and 0.5
    terms = ppo_loss(current, proximal, proximal, torch.zeros(1), torch.ones(1, 2))
    # (r - 1) - log r: 0.2 - 0.1823216 = 0.0176784 and -0.5 + 0.6931472 = 0.1931472; token mean 0.1054128
    assert terms.approx_kl.item() == pytest.approx(0.1054128, abs=1e-6)
    assert terms.clip_fraction.item() == 0.0  # zero advantage: both branches equal, nothing clipped
