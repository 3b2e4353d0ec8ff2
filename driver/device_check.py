"""The device check's probes (scripts/device_check.sh): the GPU path measured on an air-gapped node.

Such a node (many training clusters; the one this project is checked on first) reaches no package
registry and has no vLLM, Ray or redis-server; it gets the working tree and a few carried wheels. So
the check runs what needs neither: the policy is a randomly initialised model of Qwen2.5-1.5B's
shape (configs/gpu.yaml's model; no weights to download) with a synthetic tokenizer, trained with
configs/gpu.yaml's learner settings, and generated from by the transformers engine. Each probe runs
in a process of its own (a CUDA error does not come back cleanly) and writes its figures as JSON to
$SLEA_CHECK_FIGURES (and to stdout); a probe whose checks fail exits 1 after writing them. The
trainer and the engine import without Ray (learner/state_copy.py, learner/device.py).

- `learner_step`: the learner's bf16 DeepSpeed step on full-length rows (tokens/s; model TFLOP/s and
  MFU against the bf16 matmul peak this run measured; the peak memory against learner/memory.py's
  count, and whether it fits the learner's share in configs/gpu.yaml);
- `engine_and_handoff`: the transformers engine generates; its behaviour log-probs are compared
  with the learner's for the same tokens (the bf16 gap the importance weights correct); the learner
  trains on those samples and hands its weights to the engine in this process, which then
  generates with them (version 1, every tensor equal to the learner's in the engine's dtype).

usage: python -m driver.device_check PROBE [--tiny]   (--tiny: a model of a few layers, for CPU tests)
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
GPU_CONFIG = REPO / "configs" / "gpu.yaml"
# Qwen2.5-1.5B's config.json sizes (configs/gpu.yaml's model; tests/learner/test_memory.py counts it).
QWEN25_15B = dict(
    hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
    vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1_000_000.0,
)  # fmt: skip
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512, tie_word_embeddings=True, max_position_embeddings=4096,
)  # fmt: skip
# Mean |learner - engine| log-prob per token that bf16 rounding stays under; a weight that did not
# arrive, or a token off by one, moves it by the spread of the log-probs (~1 for these models).
BF16_GAP_LIMIT = 0.1
FLOAT32_GAP_LIMIT = 1e-3
# The hand-off probe's learning rate: each of its 4 AdamW steps moves every weight by about 1e-2 (the
# weights' spread is 0.02), far past bf16's rounding, so an engine left with the old weights shows it.
HANDOFF_LR = 1e-2


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer of `vocab_size` tokens "<0>".."<V-1>" (pad "<0>", EOS "<1>"): the
    probes generate from and train on token ids, and need a tokenizer only for its special ids and
    to decode; no tokenizer of Qwen's ships in a package the node has."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<0>", eos_token="<1>", unk_token="<0>")


def random_policy(shape: dict, device, seed: int = 0):
    """(Qwen2ForCausalLM of `shape`, randomly initialised in float32 on `device`, its synthetic tokenizer)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = synthetic_tokenizer(shape["vocab_size"])
    config = Qwen2Config(**shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    with torch.device(device):  # built where it trains: 1.5B parameters initialise in seconds on a GPU
        model = Qwen2ForCausalLM(config)
    return model, tokenizer


def _device() -> torch.device:
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def gpu_learner_config(device, overrides: tuple[str, ...] = ()):
    """configs/gpu.yaml's learner with the whole GPU (num_gpus 1: the peak is measured, not cut off at
    the learner's share; the figures say whether it fits the share); where there is no GPU (the CPU
    tests), on the CPU in float32, so that the engine's and the learner's log-probs agree to float32."""
    from slea.config import load_config

    cpu = ["learner.num_gpus=0", "learner.compute_dtype=float32"]
    return load_config(GPU_CONFIG, [*(["learner.num_gpus=1"] if device.type == "cuda" else cpu), *overrides]).learner


def logprob_gap(engine: list[np.ndarray], learner: list[np.ndarray]) -> dict:
    """How far the engine's behaviour log-probs are from the learner's for the same tokens (one array
    per response): mean and largest |learner - engine|, the mean signed difference, the token count."""
    pairs = zip(engine, learner)
    difference = np.concatenate(
        [np.asarray(mine, np.float64) - np.asarray(theirs, np.float64) for theirs, mine in pairs]
    )
    return {
        "mean_abs": float(np.abs(difference).mean()),
        "max_abs": float(np.abs(difference).max()),
        "mean": float(difference.mean()),
        "tokens": int(difference.size),
    }


def learner_step(
    shape: dict = QWEN25_15B, rows: int = 16, prompt_tokens: int = 2048, response_tokens: int = 128, steps: int = 3,
    matmul_size: int = 8192,
) -> dict:  # fmt: skip
    """configs/gpu.yaml's learner step (bf16 autocast over float32 masters where native) on `rows`
    rows of its longest length (a 2048-token prompt and a 128-token response), one warm-up step and
    `steps` timed ones; FLOPs and memory counted as `slea bench learner` and learner/memory.py count
    them (learner/bench.py's model_flops, matmul_peak and step timing)."""
    from learner.bench import matmul_peak, model_flops, resident_bytes, synthetic_samples, timed_with_peak
    from learner.engine import PolicyTrainer
    from learner.memory import GIB, dtype_name, reference_dtype
    from slea.config import load_config

    device = _device()
    cuda = device.type == "cuda"
    model, tokenizer = random_policy(shape, device)
    cfg = gpu_learner_config(device)
    longest_row = prompt_tokens + response_tokens
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id, longest_row=longest_row)
    counted = trainer.memory  # learner/memory.py's count, taken as the trainer started
    samples = synthetic_samples(rows, prompt_tokens, response_tokens, shape["vocab_size"])
    flops = model_flops(model, samples, cfg, seed=0)
    stats = [trainer.train_step(samples)]  # warm-up: kernels chosen, AdamW's moments allocated
    peak_tflops, seconds, peak_bytes = 0.0, [], 0
    for _ in range(steps):
        peak_tflops = max(peak_tflops, matmul_peak(trainer.compute_dtype, size=matmul_size, seconds=0.5))
        resident = torch.cuda.memory_allocated(device) if cuda else resident_bytes(trainer.module, trainer.optimizer)
        step_seconds, transient = timed_with_peak(lambda: stats.append(trainer.train_step(samples)), cuda)
        seconds.append(step_seconds)
        peak_bytes = max(peak_bytes, resident + transient)
    step_seconds = float(np.median(seconds))
    tokens = sum(sample.length for sample in samples)
    total = torch.cuda.get_device_properties(device).total_memory if cuda else None
    share = load_config(GPU_CONFIG).learner.num_gpus  # what configs/gpu.yaml gives the learner
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "model": "Qwen2.5-1.5B's shape, random weights" if shape == QWEN25_15B else f"random {shape}",
        "params": sum(param.numel() for param in model.parameters()),
        "compute_dtype": dtype_name(trainer.compute_dtype),
        "zero_stage": cfg.zero_stage,
        "activation_checkpointing": cfg.activation_checkpointing,
        "reference_dtype": dtype_name(reference_dtype(cfg, trainer.compute_dtype)),
        "micro_batch_tokens": cfg.micro_batch_tokens,
        "mini_batches": cfg.mini_batches,
        "rows": rows,
        "sequence_tokens": longest_row,
        "tokens_per_step": tokens,
        "steps": steps,
        "step_seconds": step_seconds,
        "tokens_per_s": tokens / step_seconds,
        "matmul_tflops": peak_tflops,
        "matmul_size": matmul_size,
        "model_tflop_per_step": flops / 1e12,
        "achieved_tflops": flops / step_seconds / 1e12,
        "mfu": flops / step_seconds / 1e12 / peak_tflops,
        "peak_memory_gib": peak_bytes / GIB,
        "counted_gib": counted.total / GIB,
        "counted_terms_gib": {name: round(value / GIB, 3) for name, value in asdict(counted).items()},
        "peak_over_count": peak_bytes / counted.total,
        "gpu_memory_gib": total / GIB if total else None,
        "gpu_yaml_share": share,
        "fits_gpu_yaml_share": peak_bytes <= share * total if total else None,
        "loss": stats[-1].loss,
        "grad_norm": stats[-1].grad_norm,
        "checks": {"finite": all(math.isfinite(s.loss) and math.isfinite(s.grad_norm) for s in stats)},
    }


def engine_and_handoff(shape: dict = QWEN25_15B, rows: int = 8, prompt_tokens: int = 256, new_tokens: int = 64) -> dict:
    """The transformers engine (bf16 on a GPU, float32 on a CPU) generates `rows` responses; the
    learner (configs/gpu.yaml's, on the same initial weights) scores the same tokens and trains on
    them; its state dict goes to the engine (`update_weights`), which generates again, and the
    learner scores those tokens too. The gap between the engine's log-probs and the learner's for
    the old responses after the step (`gap_without_handoff`) is what a lost hand-off would leave:
    the gap after the hand-off must be far below it."""
    from actors.engines.base import SamplingSettings
    from actors.engines.transformers_engine import TransformersEngine
    from learner.batch import TrainSample
    from learner.engine import PolicyTrainer
    from learner.memory import GIB, dtype_name

    device = _device()
    model, tokenizer = random_policy(shape, device)
    engine_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as actors.dtype auto would
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=new_tokens, stop=())  # ids only: no stop text
    engine = TransformersEngine(copy.deepcopy(model).to(engine_dtype), tokenizer, sampling, max_batch=rows)
    cfg = gpu_learner_config(device, (f"learner.lr={HANDOFF_LR}",))
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id, longest_row=prompt_tokens + new_tokens)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, shape["vocab_size"], prompt_tokens).tolist() for _ in range(rows)]  # no pad, no EOS

    def generate() -> tuple[list, float]:
        started = time.perf_counter()
        generations = engine.generate_batch(prompts)
        return generations, time.perf_counter() - started

    def samples_of(generations) -> list:
        return [
            TrainSample(np.asarray(g.prompt_ids, np.int32), g.response_ids, g.logprobs, 1.0 - 2 * (i % 2), 0)
            for i, g in enumerate(generations)
        ]

    def gap(samples) -> dict:
        learner = [values.numpy() for values in trainer.logprobs(samples)]
        return logprob_gap([sample.behaviour_logprobs for sample in samples], learner)

    generations, generate_seconds = generate()
    samples = samples_of(generations)
    before = gap(samples)
    stats = trainer.train_step(samples)
    without_handoff = gap(samples)
    started = time.perf_counter()
    state = trainer.full_state_dict()
    state_seconds = time.perf_counter() - started
    engine.update_weights(state, version=1)  # applied before the next generation
    handed_off, update_and_generate_seconds = generate()
    after = gap(samples_of(handed_off))
    weights_equal = all(
        torch.equal(tensor, state[name].to(tensor.device, tensor.dtype))
        for name, tensor in engine.model.state_dict().items()
    )
    engine.close()
    limit = BF16_GAP_LIMIT if engine_dtype == torch.bfloat16 else FLOAT32_GAP_LIMIT
    unique = {tensor.data_ptr(): tensor for tensor in state.values()}.values()  # a tied weight once
    generated = sum(len(sample.response_ids) for sample in samples)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "engine": f"transformers, {dtype_name(engine_dtype)}",
        "learner_compute_dtype": dtype_name(trainer.compute_dtype),
        "rows": rows,
        "prompt_tokens": prompt_tokens,
        "generated_tokens": generated,
        "generate_seconds": generate_seconds,
        "generate_tokens_per_s": generated / generate_seconds,
        "gap_before_update": before,
        "gap_without_handoff": without_handoff,
        "gap_after_handoff": after,
        "gap_limit": limit,
        "learner_behav_abs_log_diff": stats.behav_abs_log_diff,
        "learner_behav_weight": stats.behav_weight,
        "learner_behav_masked_fraction": stats.behav_masked_fraction,
        "learner_lr": cfg.lr,
        "loss": stats.loss,
        "handoff_state_dict_seconds": state_seconds,
        "handoff_state_dict_gib": sum(tensor.numel() * tensor.element_size() for tensor in unique) / GIB,
        "handoff_update_and_generate_seconds": update_and_generate_seconds,
        "versions_after_handoff": sorted({g.policy_version for g in handed_off}),
        "checks": {
            "finite": all(math.isfinite(g["mean_abs"]) for g in (before, without_handoff, after)),
            "gap_under_limit": before["mean_abs"] < limit and after["mean_abs"] < limit,
            "handoff_closes_the_gap": after["mean_abs"] < 0.5 * without_handoff["mean_abs"],
            "version_1_after_handoff": [g.policy_version for g in handed_off] == [1] * rows,
            "weights_equal_after_handoff": weights_equal,
        },
    }


PROBES = {"learner_step": learner_step, "engine_and_handoff": engine_and_handoff}
TINY_RUNS = {  # --tiny: each probe's code path in seconds on a CPU (tests/driver/test_device_check.py)
    "learner_step": dict(shape=TINY, rows=4, prompt_tokens=48, response_tokens=16, steps=1, matmul_size=256),
    "engine_and_handoff": dict(shape=TINY, rows=2, prompt_tokens=16, new_tokens=8),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in PROBES:
        print(f"usage: python -m driver.device_check {{{','.join(PROBES)}}} [--tiny]", file=sys.stderr)
        return 2
    figures = PROBES[argv[0]](**(TINY_RUNS[argv[0]] if "--tiny" in argv[1:] else {}))
    text = json.dumps(figures, indent=1)
    if os.environ.get("SLEA_CHECK_FIGURES"):
        Path(os.environ["SLEA_CHECK_FIGURES"]).write_text(text)
    print(text)
    failed = [name for name, ok in figures["checks"].items() if not ok]
    if failed:
        print(f"device_check {argv[0]}: failed {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
