"""bf16 compute over float32 master weights, the float32 head, and the lean PPO step (issue 20).

bf16 runs here on the tiny model whatever the CPU: where bf16 is not native (AVX2-only CPUs) it is
slow but exact to its format, so every numeric claim is checked on every machine.
"""

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from learner.batch import TrainSample, collate, response_logits
from learner.engine import PolicyTrainer, deepspeed_config
from learner.loss import gather_logprobs
from learner.precision import FloatHead, compute_context, use_float_head
from slea.config import ConfigError, LearnerConfig, load_config
from slea.models import tiny_model
from slea.precision import BF16_MIN_SPEEDUP, PROBE_SHAPE, bf16_pays, bf16_pays_on_cpu, native_bf16, resolve_dtype


def samples(seed=0, teacher_rows=()):
    rng = np.random.default_rng(seed)
    rows = []
    for index, ((p, r), a) in enumerate(zip([(5, 3), (9, 4), (3, 6), (20, 5)], [1.0, -1.0, 0.5, -0.5])):
        teacher = rng.integers(0, 1000, p + 7).astype(np.int32) if index in teacher_rows else np.zeros(0, np.int32)
        rows.append(
            TrainSample(
                rng.integers(0, 1000, p).astype(np.int32),
                rng.integers(0, 1000, r).astype(np.int32),
                np.full(r, -10.8, np.float32),
                float(a),
                0,
                teacher_prompt_ids=teacher,
            )
        )
    return rows


# -- which dtype `auto` picks ----------------------------------------------------------------


def test_bf16_pays_only_where_it_is_at_least_a_fifth_faster():
    assert bf16_pays(float32_seconds=1.0, bfloat16_seconds=0.5)  # a Zen 4 EPYC's AVX512-BF16: 2x
    assert bf16_pays(1.2, 1.0)  # exactly the margin: 1.0 x 1.2 <= 1.2
    assert not bf16_pays(1.0, 0.9)  # 1.11x: not worth 8 bits of mantissa
    assert not bf16_pays(0.33, 0.6)  # the Xeon VM with AVX512-BF16 and no AMX: bf16 at half the speed


def test_auto_is_float32_without_bf16_instructions_and_follows_a_clear_measurement_with_them():
    flags = set(Path("/proc/cpuinfo").read_text().split())  # an independent reading of the instructions
    assert native_bf16("cpu") == bool({"amx_bf16", "avx512_bf16"} & flags)
    assert resolve_dtype("float32", "cpu") == "float32" and resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert native_bf16("cuda") is torch.cuda.is_available()  # no CUDA: never bf16 "on the GPU"
    if not native_bf16("cpu"):
        assert not bf16_pays_on_cpu() and resolve_dtype("auto", "cpu") == "float32"
        return
    # With the instructions: an independent, longer measurement of the probe's product. Where it is
    # clearly on one side of the margin, `auto` must be on that side; near the margin either is right.
    speedup = product_rate(torch.bfloat16) / product_rate(torch.float32)
    if speedup >= 1.5 * BF16_MIN_SPEEDUP:
        assert resolve_dtype("auto", "cpu") == "bfloat16", f"bf16 ran {speedup:.2f}x fp32 here"
    elif speedup <= 1.0:
        assert resolve_dtype("auto", "cpu") == "float32", f"bf16 ran {speedup:.2f}x fp32 here"


def product_rate(dtype: torch.dtype, seconds: float = 1.0) -> float:
    """Products of PROBE_SHAPE a second in `dtype`, over about `seconds`."""
    rows, inner, columns = PROBE_SHAPE
    left, right = torch.randn(rows, inner).to(dtype), torch.randn(inner, columns).to(dtype)
    left @ right
    products, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        left @ right
        products += 1
    return products / (time.perf_counter() - start)


def test_model_dtype_is_a_config_error_naming_the_new_keys():
    with pytest.raises(ConfigError, match=r"model.dtype='bfloat16'.*actors.dtype.*learner.compute_dtype"):
        load_config(overrides=["model.dtype=bfloat16"])
    config = load_config(overrides=["actors.dtype=float32", "learner.compute_dtype=bfloat16"])
    assert config.actors.dtype == "float32" and config.learner.compute_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="learner.compute_dtype"):  # fp16 training needs loss scaling: not offered
        load_config(overrides=["learner.compute_dtype=float16"])


# -- the float32 head ------------------------------------------------------------------------


def test_float_head_keeps_logits_float32_under_bf16_autocast():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    hidden = torch.randn(3, 64) * 4  # logits of a few tens: where bf16's steps are 0.125 and more
    exact = hidden @ linear.weight.T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = linear(hidden)
    assert rounded.dtype == torch.bfloat16 and (rounded.float() - exact).abs().max() > 1e-2
    linear.__class__ = FloatHead
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept = linear(hidden)
    assert kept.dtype == torch.float32
    torch.testing.assert_close(kept, exact, atol=1e-5, rtol=1e-5)


def test_use_float_head_keeps_weights_tying_and_keys():
    model, _ = tiny_model()
    keys = list(model.state_dict())
    use_float_head(model)
    assert type(model.lm_head) is FloatHead and list(model.state_dict()) == keys
    assert model.lm_head.weight is model.get_input_embeddings().weight  # still tied, as SmolLM2


# -- bf16 compute, float32 masters -----------------------------------------------------------


@pytest.mark.slow
def test_deepspeed_keeps_float32_parameters_and_gradients_under_bf16_compute():
    config = deepspeed_config(LearnerConfig(zero_stage=2), world_size=1, compute_dtype=torch.bfloat16)
    assert config["bf16"] == {"enabled": False} and config["data_types"] == {"grad_accum_dtype": "fp32"}
    assert config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    model, tokenizer = tiny_model()
    trainer = PolicyTrainer(model, LearnerConfig(lr=1e-3, compute_dtype="bfloat16"), tokenizer.pad_token_id)
    assert trainer.compute_dtype == torch.bfloat16
    trainer.train_step(samples())
    assert {param.dtype for param in trainer.module.parameters()} == {torch.float32}
    states = trainer.optimizer.state.values()
    assert {value.dtype for state in states for key, value in state.items() if key != "step"} == {torch.float32}


@pytest.mark.slow
def test_a_bf16_learner_moves_every_parameter_as_the_fp32_learner_does():
    """Same weights, same batch, two steps: the bf16-compute learner's loss agrees with the fp32 one
    within 2% (bf16 keeps 8 bits of mantissa: ~0.4% per rounding, a few roundings deep), and
    every parameter tensor moves, in nearly the same direction (cosine of the two updates > 0.9)."""
    model, tokenizer = tiny_model()
    before = copy.deepcopy(model.state_dict())
    results = {}
    for dtype in ("float32", "bfloat16"):
        cfg = LearnerConfig(lr=1e-3, compute_dtype=dtype, mini_batches=2, kl_coef=0.01)
        trainer = PolicyTrainer(copy.deepcopy(model), cfg, tokenizer.pad_token_id)
        stats = [trainer.train_step(samples(seed)) for seed in (0, 1)]
        results[dtype] = (stats, trainer.full_state_dict())
    (fp32_stats, fp32_state), (bf16_stats, bf16_state) = results["float32"], results["bfloat16"]
    for fp32_step, bf16_step in zip(fp32_stats, bf16_stats):
        assert bf16_step.loss == pytest.approx(fp32_step.loss, rel=0.02, abs=1e-4)
        assert bf16_step.pg_loss == pytest.approx(fp32_step.pg_loss, rel=0.02, abs=1e-4)
    for name, start in before.items():
        fp32_move, bf16_move = (fp32_state[name] - start).flatten(), (bf16_state[name] - start).flatten()
        assert fp32_move.abs().max() > 0 and bf16_move.abs().max() > 0, f"{name} did not move"
        assert F.cosine_similarity(fp32_move, bf16_move, dim=0) > 0.9, name


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_first_mini_batch_has_ratio_exactly_one(dtype):
    """One mini-batch: its own forward is its proximal policy, so no ratio leaves 1 by a single ulp."""
    model, tokenizer = tiny_model()
    trainer = PolicyTrainer(model, LearnerConfig(lr=1e-3, compute_dtype=dtype, mini_batches=1), tokenizer.pad_token_id)
    for seed in (0, 1):
        stats = trainer.train_step(samples(seed))
        assert stats.approx_kl == 0.0 and stats.clip_fraction == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_no_grad_scoring_pass_computes_what_the_update_computes(dtype):
    """Mini-batches after the first are scored by a no-grad forward: bit for bit the numbers the
    grad forward of the same weights gives, so their first ratio is 1 as well."""
    model, tokenizer = tiny_model()
    trainer = PolicyTrainer(model, LearnerConfig(compute_dtype=dtype), tokenizer.pad_token_id)
    trainer.engine.train()
    (micro,) = trainer._score_before_updates(samples(), distilling=False, proximal=True)
    with trainer._compute():
        with_grad = gather_logprobs(response_logits(trainer.engine, micro.batch), micro.batch.response_ids)
    assert with_grad.requires_grad
    assert torch.equal(micro.proximal, with_grad.detach())


# -- the lean step: same numbers, less work ----------------------------------------------------


def test_fused_adamw_makes_the_unfused_update():
    torch.manual_seed(0)
    params = [torch.randn(64, 32), torch.randn(32)]
    copies = {fused: [param.clone().requires_grad_() for param in params] for fused in (False, True)}
    optimizers = {
        fused: torch.optim.AdamW(copies[fused], lr=1e-3, fused=fused, foreach=False if not fused else None)
        for fused in (False, True)
    }
    for _ in range(3):
        grads = [torch.randn_like(param) for param in params]
        for fused in (False, True):
            for param, grad in zip(copies[fused], grads):
                param.grad = grad.clone()
            optimizers[fused].step()
    for unfused, fused in zip(copies[False], copies[True]):
        torch.testing.assert_close(fused, unfused, atol=1e-7, rtol=1e-6)


@pytest.mark.slow
def test_one_rank_reduces_no_gradients_and_reads_the_norm_once():
    model, tokenizer = tiny_model()
    trainer = PolicyTrainer(model, LearnerConfig(lr=1e-3, micro_batch_tokens=32), tokenizer.pad_token_id)
    reductions = []
    real_allreduce = trainer.engine.allreduce_gradients
    trainer.engine.allreduce_gradients = lambda *a, **k: reductions.append(1) or real_allreduce(*a, **k)
    stats = trainer.train_step(samples())
    assert reductions == [] and stats.grad_norm > 0 and np.isfinite(stats.grad_norm)
    assert isinstance(trainer.optimizer, torch.optim.AdamW) and trainer.optimizer.defaults["fused"]


def _count_forwards(module: torch.nn.Module) -> list[int]:
    rows = []
    module.register_forward_pre_hook(
        lambda _module, _args, kwargs: rows.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    return rows


@pytest.mark.slow
def test_one_mini_batch_without_kl_runs_one_forward_per_micro_batch():
    """No scoring pass at all: no reference (kl_coef 0) and the update's own forward is the proximal."""
    model, tokenizer = tiny_model()
    cfg = LearnerConfig(lr=1e-3, mini_batches=1, kl_coef=0.0, micro_batch_tokens=32)
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id)
    assert trainer.reference is None
    rows = _count_forwards(trainer.module)
    stats = trainer.train_step(samples())
    assert len(rows) == stats.micro_batches == 3 and sum(rows) == 4


@pytest.mark.slow
def test_the_edge_teacher_runs_only_the_distilled_rows_with_the_numbers_of_each_row_alone():
    model, tokenizer = tiny_model()
    pad = tokenizer.pad_token_id
    # float32: each row's numbers alone and in the batch agree to float noise (bf16 rounds them apart)
    trainer = PolicyTrainer(model, LearnerConfig(edge_distill_coef=0.1, compute_dtype="float32"), pad)
    chunk = samples(teacher_rows=(1, 3))
    batch = collate(chunk, pad)
    rows = _count_forwards(trainer.module)
    with torch.no_grad(), trainer._compute():
        teacher, distilled = trainer._teacher_logprobs(chunk, batch)
    assert rows == [2] and distilled.tolist() == [0.0, 1.0, 0.0, 1.0]
    width = batch.response_ids.shape[1]
    for index, sample in enumerate(chunk):
        length = len(sample.response_ids)
        if index in (1, 3):  # the teacher prompt's log-probs, right-aligned in the student's slots
            alone = collate(
                [
                    TrainSample(
                        sample.teacher_prompt_ids, sample.response_ids, sample.behaviour_logprobs, sample.advantage, 0
                    )
                ],
                pad,
            )
            with torch.no_grad():
                expected = gather_logprobs(response_logits(trainer.module, alone), alone.response_ids)[0]
            torch.testing.assert_close(teacher[index, width - length :], expected, atol=1e-5, rtol=1e-5)
        else:
            assert not teacher[index].any()


def test_compute_context_is_autocast_only_for_a_lower_precision():
    with compute_context(torch.device("cpu"), torch.float32):
        assert not torch.is_autocast_enabled("cpu")
    with compute_context(torch.device("cpu"), torch.bfloat16):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_bf16_logits_are_cast_to_float32_before_the_temperature_divides_them():
    """A bf16 model (vLLM's Qwen on a GPU, say) gives bf16 logits: divided in bf16 they round again."""
    model, tokenizer = tiny_model()
    model = model.to(torch.bfloat16)
    batch = collate(samples(), tokenizer.pad_token_id)
    with torch.no_grad():
        logits = response_logits(model, batch, temperature=0.7)
        raw = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=batch.response_ids.shape[1] + 1,
        ).logits[:, :-1]
    assert raw.dtype == torch.bfloat16 and logits.dtype == torch.float32
    assert torch.equal(logits, raw.float() / 0.7)
    assert not torch.equal(logits, (raw / 0.7).float())  # what dividing first would have given
