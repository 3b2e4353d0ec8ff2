"""The DeepSpeed trainer on CPU (gloo, one process, no torchrun) with the tiny model."""

import copy

import numpy as np
import pytest
import torch

from learner.batch import TrainSample
from learner.bench import torch_step
from learner.engine import PolicyTrainer, deepspeed_config
from slea.config import LearnerConfig
from slea.models import tiny_model


def samples(seed=0):
    rng = np.random.default_rng(seed)
    return [
        TrainSample(
            rng.integers(0, 1000, p).astype(np.int32),
            rng.integers(0, 1000, r).astype(np.int32),
            np.full(r, -10.8, np.float32),
            float(a),
            0,
        )
        for (p, r), a in zip([(5, 3), (9, 4), (3, 6), (20, 5)], [1.0, -1.0, 0.5, -0.5])
    ]


def test_deepspeed_config_is_a_plain_dict_from_the_learner_config():
    config = deepspeed_config(LearnerConfig(zero_stage=2, grad_clip=0.5), world_size=1, compute_dtype=torch.float32)
    assert config["zero_optimization"]["stage"] == 2 and config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": False} and config["train_batch_size"] == 1


@pytest.mark.slow
def test_micro_batching_gives_the_same_update_as_one_batch():
    updated = []
    for budget in (4096, 32):  # one micro-batch vs three (lengths 8+9 | 13 | 25), accumulated
        model, tokenizer = tiny_model()
        cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=budget, warmup_steps=2, mini_batches=1)
        trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id)
        stats = trainer.train_step(samples())
        assert stats.micro_batches == (1 if budget == 4096 else 3)
        assert stats.lr == pytest.approx(5e-4)  # first warm-up step: lr / 2
        assert stats.grad_norm > 0 and stats.response_tokens == 18 and stats.tokens == 55
        updated.append((stats, trainer.full_state_dict()))
    (whole, whole_state), (parts, parts_state) = updated
    assert parts.pg_loss == pytest.approx(whole.pg_loss, abs=1e-6) and parts.kl == pytest.approx(whole.kl, abs=1e-6)
    assert parts.grad_norm == pytest.approx(whole.grad_norm, rel=1e-4)
    # Adam's first step is ~lr * sign(grad): a gradient within float noise of 0 may move by up to
    # lr (5e-4) either way, so allow a tenth of a step, not bit equality.
    for name, tensor in whole_state.items():
        torch.testing.assert_close(parts_state[name], tensor, atol=5e-5, rtol=1e-5)


@pytest.mark.slow
def test_mini_batches_clip_against_the_weights_before_the_batch():
    """Four mini-batches, two epochs: eight optimizer steps whose ratios are taken against the
    weights before the first one, exactly as a plain PyTorch PPO loop does (learner/bench.py
    `torch_step`); from the second step on the ratio leaves 1 and the clip bites. Before PPO
    mini-batches the learner took one step per batch with ratio 1: clip_fraction was always 0."""
    cfg = LearnerConfig(lr=1e-3, mini_batches=4, ppo_epochs=2, micro_batch_tokens=16)
    model, tokenizer = tiny_model()
    plain = copy.deepcopy(model)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id, seed=7)
    stats = trainer.train_step(samples())
    assert stats.optimizer_steps == 8 and stats.micro_batches == 8  # one row per mini-batch here, two epochs
    assert stats.clip_fraction > 0.05 and stats.approx_kl > 0
    optimizer = torch.optim.AdamW(plain.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0)
    torch_step(plain, reference, optimizer, samples(), cfg, tokenizer.pad_token_id, torch.device("cpu"), seed=7)
    ours = trainer.full_state_dict()
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(ours[name], tensor, atol=5e-5, rtol=1e-4)


@pytest.mark.slow
def test_one_mini_batch_never_clips():
    """The control: a single optimizer step per batch starts at the proximal weights, ratio 1."""
    model, tokenizer = tiny_model()
    stats = PolicyTrainer(model, LearnerConfig(lr=1e-3, mini_batches=1), tokenizer.pad_token_id).train_step(samples())
    assert stats.optimizer_steps == 1 and stats.clip_fraction == 0.0 and stats.approx_kl == pytest.approx(0.0, abs=1e-7)


@pytest.mark.slow
def test_zero3_trains_and_gathers_full_weights():
    model, tokenizer = tiny_model()
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    trainer = PolicyTrainer(model, LearnerConfig(lr=1e-3, zero_stage=3, kl_coef=0.0), tokenizer.pad_token_id)
    before = trainer.full_state_dict()
    stats = trainer.train_step(samples())
    after = trainer.full_state_dict()
    assert {name: tensor.shape for name, tensor in after.items()} == shapes  # tied lm_head included
    assert stats.grad_norm > 0 and stats.kl == 0.0
    assert any(not torch.equal(before[name], after[name]) for name in before)


@pytest.mark.slow
def test_log_probs_are_those_of_the_sampling_temperature():
    """Actors sampling at temperature T record log-probs of softmax(logits / T); the trainer must
    score the same distribution, or every ratio (and the behaviour weight) would be off."""
    from actors.engines import SamplingSettings
    from actors.engines.transformers_engine import TransformersEngine

    model, tokenizer = tiny_model()
    engine = TransformersEngine(
        copy.deepcopy(model), tokenizer, SamplingSettings(temperature=0.7, top_p=1.0, max_new_tokens=6)
    )
    prompt = tokenizer("Task: find the key.\nYour action:")["input_ids"]
    generation = engine.generate_batch([prompt])[0]
    trainer = PolicyTrainer(model, LearnerConfig(kl_coef=0.0), tokenizer.pad_token_id, temperature=0.7)
    sample = TrainSample(np.asarray(prompt, np.int32), generation.response_ids, generation.logprobs, 0.0, 0)
    np.testing.assert_allclose(trainer.logprobs([sample])[0].numpy(), generation.logprobs, atol=1e-4)
