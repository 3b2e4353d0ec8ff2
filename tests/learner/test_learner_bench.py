"""`slea bench learner` on the tiny model: the figures it prints are the ones it measured."""

import pytest

from learner.bench import bench_learner, matmul_peak, model_flops, synthetic_samples
from slea.config import LearnerConfig
from slea.models import tiny_model
from slea.precision import bf16_pays_on_cpu, native_bf16


def test_model_flops_counts_each_forward_the_step_runs():
    """Tiny model: 2 layers of d=64 (attention 4 x 64 x 64 less the shared K/V halves, MLP 3 x 64 x 128, two
    norms) and the tied 49152 x 64 head. 4 rows of 10 tokens (4 responses), one mini-batch, no KL: every
    token trained once (6 N per token), nothing scored without grad."""
    model, _ = tiny_model()
    body = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64  # q,o + k,v (2 of 4 heads' width) + MLP + norms
    samples = synthetic_samples(4, 6, 4, model.config.vocab_size)
    flops = model_flops(model, samples, LearnerConfig(mini_batches=1, kl_coef=0.0), seed=0)
    assert flops == 6 * body * 40 + 6 * 49152 * 64 * 16
    # Two mini-batches and a reference: the second mini-batch's 2 rows are scored, the reference scores all 4.
    scored = model_flops(model, samples, LearnerConfig(mini_batches=2, kl_coef=0.01), seed=0)
    assert scored == flops + 2 * body * (20 + 40) + 2 * 49152 * 64 * (8 + 16)


def test_matmul_peak_is_a_rate():
    assert matmul_peak(__import__("torch").float32, size=256, seconds=0.05) > 0


@pytest.mark.slow
def test_bench_learner_reports_ratio_mfu_and_the_bf16_arm():
    result = bench_learner("tiny", batch_size=4, prompt_tokens=24, response_tokens=8, steps=1, warmup_steps=1)
    # the learner's own `auto`: bf16 where the CPU has the instructions and they pay (slea/precision.py)
    assert result["compute_dtype"] == ("bfloat16" if bf16_pays_on_cpu() else "float32")
    assert result["ratio"] > 0 and 0 < result["mfu"] < 1 and result["optimizer_steps_per_batch"] == 4
    assert result["achieved_tflops"] == pytest.approx(result["mfu"] * max(result["matmul_tflops"].values()))
    if native_bf16("cpu"):
        assert result["bf16_over_fp32"] > 0 and result["bf16_skipped"] is None
    else:
        assert result["bf16_over_fp32"] is None and "no native bf16" in result["bf16_skipped"]
