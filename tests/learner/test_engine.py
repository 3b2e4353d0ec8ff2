"""The DeepSpeed trainer on CPU (gloo, one process, no torchrun) with the tiny model."""

import copy
import os
import sys

import numpy as np
import pytest
import torch

from learner.batch import TrainSample, ppo_schedule
from learner.engine import PolicyTrainer, deepspeed_config, use_the_ninja_of_this_python
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
        # float32: the decomposition is exact there; bf16 rounds each micro-batch's sums apart
        cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=budget, warmup_steps=2, mini_batches=1, compute_dtype="float32")
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


def plain_ppo_update(model, frozen, samples: list[TrainSample], order: list[list[int]], cfg: LearnerConfig) -> None:
    """The update PolicyTrainer.train_step must make, written from the formulas in fp32 plain torch,
    sharing no code with the trainer: one unpadded forward per sample; log-probs under the weights
    before the first step (proximal) and the frozen reference; then per mini-batch of `order` the
    decoupled-PPO loss summed over its tokens / its response tokens, clipped gradients, one AdamW step."""

    def response_logits(net, sample):  # [R, V]: the positions that predict the response tokens
        ids = torch.tensor(np.concatenate([sample.prompt_ids, sample.response_ids]), dtype=torch.long)[None]
        return net(ids).logits[0, len(sample.prompt_ids) - 1 : -1].float()

    def logprobs(logits, sample):
        return torch.log_softmax(logits, -1)[torch.arange(len(sample.response_ids)), sample.response_ids.tolist()]

    with torch.no_grad():
        proximal = [logprobs(response_logits(model, s), s) for s in samples]
        reference = [logprobs(response_logits(frozen, s), s) for s in samples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for rows in order:
        tokens = sum(len(samples[i].response_ids) for i in rows)
        for i in rows:
            sample, logits = samples[i], response_logits(model, samples[i])
            current = logprobs(logits, sample)
            ratio = torch.exp(current - proximal[i])
            clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
            surrogate = torch.maximum(-sample.advantage * ratio, -sample.advantage * clipped)
            weight = torch.exp(proximal[i] - torch.from_numpy(sample.behaviour_logprobs))  # behaviour -> proximal
            surrogate = surrogate * weight * (weight <= cfg.behav_weight_cap)
            log_ratio = reference[i] - current
            kl = (log_ratio.exp() - log_ratio - 1).clamp(-10, 10)  # k3, as verl clamps it
            entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
            ((surrogate + cfg.kl_coef * kl - cfg.entropy_coef * entropy).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.slow
def test_mini_batches_clip_against_the_weights_before_the_batch():
    """Four mini-batches, two epochs: eight optimizer steps whose ratios are taken against the
    weights before the first one, as the plain loop above does; from the second step on the ratio
    leaves 1 and the clip bites, and one sample's behaviour weight is over the cap. Before PPO
    mini-batches the learner took one step per batch with ratio 1: clip_fraction was always 0."""
    # fp32 compute, as the loop: bf16 autocast over the fp32 masters is checked in test_precision.py
    cfg = LearnerConfig(lr=1e-3, mini_batches=4, ppo_epochs=2, micro_batch_tokens=16, compute_dtype="float32")
    batch = samples()
    batch[2].behaviour_logprobs[:] = -13.0  # weight e^(-10.8 + 13) ~ 9 > behav_weight_cap 5: masked out
    model, tokenizer = tiny_model()
    plain = copy.deepcopy(model)
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id, seed=7)
    stats = trainer.train_step(batch)
    assert stats.optimizer_steps == 8 and stats.micro_batches == 8  # one row per mini-batch here, two epochs
    assert stats.clip_fraction > 0.05 and stats.approx_kl > 1e-4
    assert stats.behav_masked_fraction == pytest.approx(2 / 8)  # sample 2's steps, all masked: 2 of the 8
    # The order of the rows is the trainer's seeded draw (its first batch: seed 7); the loop takes it
    # as data, once it is checked to be a schedule: every epoch visits each row once.
    parts, steps = ppo_schedule(len(batch), cfg.mini_batches, cfg.ppo_epochs, seed=7)
    assert sorted(row for part in parts for row in part) == [0, 1, 2, 3]
    assert sorted(steps[:4]) == sorted(steps[4:]) == [0, 1, 2, 3]
    plain_ppo_update(plain, frozen, batch, [parts[index] for index in steps], cfg)
    ours = trainer.full_state_dict()
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(ours[name], tensor, atol=5e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


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
def test_activation_checkpointing_trades_memory_not_the_update():
    """Recomputing each layer in backward (non-reentrant, float32) gives the update of the plain
    backward: the setting is a memory/compute trade and nothing else."""
    updated = []
    for checkpointing in (False, True):
        model, tokenizer = tiny_model()
        cfg = LearnerConfig(lr=1e-3, mini_batches=2, compute_dtype="float32", activation_checkpointing=checkpointing)
        trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id)
        assert trainer.module.is_gradient_checkpointing == checkpointing
        updated.append((trainer.train_step(samples()), trainer.full_state_dict()))
    (plain, plain_state), (recomputed, recomputed_state) = updated
    assert recomputed.loss == pytest.approx(plain.loss, abs=1e-6)
    assert recomputed.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    for name, tensor in plain_state.items():
        torch.testing.assert_close(recomputed_state[name], tensor, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_the_frozen_reference_holds_its_weights_in_the_reference_dtype():
    """auto follows the compute dtype; before any update the policy is the reference, so the KL
    term is exactly 0 against a float32 reference and bf16 rounding against a bf16 one."""
    kls = {}
    for reference_dtype, held in (("auto", torch.float32), ("bfloat16", torch.bfloat16)):
        model, tokenizer = tiny_model()
        cfg = LearnerConfig(mini_batches=1, compute_dtype="float32", reference_dtype=reference_dtype, kl_coef=0.1)
        trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id)
        assert {param.dtype for param in trainer.reference.parameters()} == {held}
        assert {param.dtype for param in trainer.module.parameters()} == {torch.float32}  # the masters stay float32
        kls[reference_dtype] = trainer.train_step(samples()).kl
    assert kls["auto"] == 0.0
    assert 0.0 < kls["bfloat16"] < 1e-3, kls


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
    # float32 on both sides (the engine generates with the model as given): the test is about the
    # temperature, not about the actor/learner precision gap (test_precision.py measures that)
    trainer = PolicyTrainer(
        model, LearnerConfig(kl_coef=0.0, compute_dtype="float32"), tokenizer.pad_token_id, temperature=0.7
    )
    sample = TrainSample(np.asarray(prompt, np.int32), generation.response_ids, generation.logprobs, 0.0, 0)
    np.testing.assert_allclose(trainer.logprobs([sample])[0].numpy(), generation.logprobs, atol=1e-4)


def test_the_ninja_beside_this_python_comes_first_on_path(tmp_path, monkeypatch):
    """Two ninjas of different versions recompile DeepSpeed's comm op on every switch: the one
    installed beside the interpreter goes first, once, and nothing changes where it has none."""
    venv_bin, system_bin = tmp_path / "venv-bin", tmp_path / "usr-bin"
    venv_bin.mkdir()
    system_bin.mkdir()
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(system_bin))
    use_the_ninja_of_this_python()
    assert os.environ["PATH"] == str(system_bin)  # no ninja beside this Python: PATH as it was

    (venv_bin / "ninja").write_text("")
    use_the_ninja_of_this_python()
    assert os.environ["PATH"] == f"{venv_bin}{os.pathsep}{system_bin}"
    use_the_ninja_of_this_python()  # already first: not added twice
    assert os.environ["PATH"] == f"{venv_bin}{os.pathsep}{system_bin}"
