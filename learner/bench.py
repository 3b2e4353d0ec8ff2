"""`slea bench learner`: the DeepSpeed learner step against the machine's limit and plain PyTorch.

Three figures, all from one run (machines here are noisy: read ratios, not absolute figures):
- `ratio`: the DeepSpeed trainer against a plain PyTorch AdamW loop (`torch_step`) on the same
  initial weights, samples, loss, compute dtype and optimizer steps; only the wrapper differs (and
  the trainer's lean step: the first mini-batch is not scored separately), so this is what
  DeepSpeed costs or saves.
- `mfu`: model FLOPs per second over the best matmul rate this machine reached in the same run
  (`matmul_peak`, 2048^2 in bf16 and in fp32, measured before every timed round, best kept: a
  peak taken once, under a passing load, would understate the limit; 512^2 for a bf16 that is
  not native, where one 2048^2 product takes a minute). Model FLOPs count 6 x non-embedding parameters per
  trained token, 2 x per token scored without grad, and the LM head (d x V per position) on the
  response positions it runs on; attention's sequence-length term is left out (under 5% at 256).
- `bf16_over_fp32`: the same trainer step with `learner.compute_dtype` bf16 against fp32. Where the
  CPU has no native bf16 (no AMX, no AVX512-BF16) a bf16 matmul is ~100x slower than fp32; the
  bf16 arm is then not run (it would take hours) and the report says why.
Peak memory is what each side keeps resident (parameters, gradients, optimizer state) plus the
largest transient growth during one of its steps (activations, logits), since both live in one process.
"""

from __future__ import annotations

import copy
import os
import threading
import time

import numpy as np
import torch

from learner.batch import TrainSample, collate, plan_micro_batches, ppo_schedule, response_logits
from learner.engine import PolicyTrainer
from learner.loss import gather_logprobs, ppo_loss, token_entropy
from learner.precision import compute_context, use_float_head
from slea.config import LearnerConfig
from slea.models import load_model, tiny_model
from slea.precision import native_bf16, resolve_dtype


class StepMemory:
    """Transient peak memory of one step above what was resident when it started.

    GPU: the CUDA allocator's peak; CPU: RSS sampled every few milliseconds on a thread.
    """

    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self, base: int) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, self._rss() - base)

    def __enter__(self) -> StepMemory:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._thread = threading.Thread(target=self._sample, args=(self._rss(),), daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
        else:
            self._stop.set()
            self._thread.join()


def resident_bytes(model: torch.nn.Module, optimizer) -> int:
    """Bytes held between steps: parameters, their gradients, optimizer state."""
    tensors = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    inner = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed wraps the torch optimizer
    for state in inner.state.values():
        tensors += [value for value in state.values() if isinstance(value, torch.Tensor)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def synthetic_samples(
    batch_size: int, prompt_tokens: int, response_tokens: int, vocab: int, seed: int = 0
) -> list[TrainSample]:
    """Random token samples with mixed-sign advantages (what the model sees does not change the cost)."""
    rng = np.random.default_rng(seed)
    return [
        TrainSample(
            prompt_ids=rng.integers(0, vocab, prompt_tokens, dtype=np.int32),
            response_ids=rng.integers(0, vocab, response_tokens, dtype=np.int32),
            behaviour_logprobs=np.full(response_tokens, -np.log(vocab), dtype=np.float32),
            advantage=float(rng.standard_normal()),
            policy_version=0,
        )
        for _ in range(batch_size)
    ]


def matmul_peak(dtype: torch.dtype, size: int = 2048, seconds: float = 2.0) -> float:
    """TFLOP/s of a size x size matmul in `dtype` on the learner's device: the machine's own limit.
    Repeats for about `seconds` (at least twice) after one warm-up product."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    left, right = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    left @ right
    runs, start = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - start < seconds:
        left @ right
        runs += 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return 2 * size**3 * runs / (time.perf_counter() - start) / 1e12


def model_flops(model: torch.nn.Module, samples: list[TrainSample], cfg: LearnerConfig, seed: int) -> float:
    """FLOPs of one learner batch as PolicyTrainer.train_step computes it (see the module docstring)."""
    head = model.get_output_embeddings().weight
    embedding = model.get_input_embeddings().weight
    tied = head.data_ptr() == embedding.data_ptr()
    body = sum(param.numel() for param in model.parameters()) - embedding.numel() - (0 if tied else head.numel())
    head_per_position = head.numel()  # d x V multiply-adds
    mini_batches, steps = ppo_schedule(len(samples), cfg.mini_batches, cfg.ppo_epochs, seed)
    scored = [i for index, rows in enumerate(mini_batches) if index != steps[0] for i in rows]
    if cfg.kl_coef > 0:
        scored += list(range(len(samples)))  # the frozen reference scores every row
    trained_tokens = sum(samples[i].length for index in steps for i in mini_batches[index])
    trained_responses = sum(len(samples[i].response_ids) for index in steps for i in mini_batches[index])
    scored_tokens = sum(samples[i].length for i in scored)
    scored_responses = sum(len(samples[i].response_ids) for i in scored)
    return (
        6 * body * trained_tokens
        + 2 * body * scored_tokens
        + 6 * head_per_position * trained_responses
        + 2 * head_per_position * scored_responses
    )


def torch_step(
    model,
    reference,
    optimizer,
    samples: list[TrainSample],
    cfg: LearnerConfig,
    pad_id: int,
    device,
    seed: int,
    compute_dtype: torch.dtype = torch.float32,
) -> None:
    """The same update as PolicyTrainer.train_step, written as a plain PyTorch loop: score every
    micro-batch with the weights before the first update (proximal, reference), then one
    optimizer step per mini-batch in the schedule's order; forwards under the same autocast."""
    mini_batches, steps = ppo_schedule(len(samples), cfg.mini_batches, cfg.ppo_epochs, seed)
    model.train()
    scored = []
    with torch.no_grad(), compute_context(device, compute_dtype):
        for rows in mini_batches:
            micro = []
            for indices in plan_micro_batches([samples[i].length for i in rows], cfg.micro_batch_tokens):
                batch = collate([samples[rows[i]] for i in indices], pad_id, device)
                proximal = gather_logprobs(response_logits(model, batch), batch.response_ids)
                ref = (
                    gather_logprobs(response_logits(reference, batch), batch.response_ids)
                    if reference is not None
                    else None
                )
                micro.append((batch, proximal, ref))
            scored.append(micro)
    for index in steps:
        total_response = sum(len(samples[i].response_ids) for i in mini_batches[index])
        for batch, proximal, ref_logprobs in scored[index]:
            with compute_context(device, compute_dtype):
                logits = response_logits(model, batch)
            terms = ppo_loss(
                gather_logprobs(logits, batch.response_ids),
                proximal,
                batch.behaviour_logprobs,
                batch.advantages,
                batch.response_mask,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                behav_weight_cap=cfg.behav_weight_cap,
                ref_logprobs=ref_logprobs,
                kl_coef=cfg.kl_coef,
                entropy=token_entropy(logits) if cfg.entropy_coef > 0 else None,
                entropy_coef=cfg.entropy_coef,
                total_tokens=total_response,
            )
            terms.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def timed_with_peak(run, cuda: bool) -> tuple[float, int]:
    """(seconds, transient peak bytes) of one call."""
    with StepMemory() as memory:
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return seconds, memory.peak_bytes


def bench_learner(
    model_name: str = "smollm2-135m-instruct",
    batch_size: int = 8,
    prompt_tokens: int = 192,
    response_tokens: int = 64,
    steps: int = 3,
    warmup_steps: int = 1,
    zero_stage: int = 0,
    micro_batch_tokens: int = 1024,
    mini_batches: int = 4,
    lr: float = 1e-5,
) -> dict:
    """The learner step in the compute dtype `auto` picks here, against plain torch taking the same
    `mini_batches` PPO optimizer steps per batch, against the other compute dtype where that is
    native, and against the machine's matmul peak.

    model_name "tiny" uses `slea.models.tiny_model` (a plumbing check, not a throughput figure).
    The learning rate does not change the cost; it is set high enough (1e-5, the learning configs')
    that the later mini-batches move the policy past the clip range, so `clip_fraction` shows the
    PPO clip at work.
    """
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    model, tokenizer = tiny_model() if model_name == "tiny" else load_model(model_name)
    native = native_bf16(device.type)
    peaks = dict.fromkeys(("bfloat16", "float32"), 0.0)

    def measure_peaks() -> None:
        for name in peaks:
            size = 2048 if native or name == "float32" else 512
            peaks[name] = max(peaks[name], matmul_peak(getattr(torch, name), size=size, seconds=0.5))

    primary = resolve_dtype("auto", device.type)
    arms = ["float32", "bfloat16"] if native else ["float32"]
    samples = synthetic_samples(batch_size, prompt_tokens, response_tokens, model.config.vocab_size)
    tokens = sum(sample.length for sample in samples)
    pad_id = tokenizer.pad_token_id

    def config(dtype: str) -> LearnerConfig:
        return LearnerConfig(
            zero_stage=zero_stage,
            micro_batch_tokens=micro_batch_tokens,
            mini_batches=mini_batches,
            lr=lr,
            compute_dtype=dtype,
            num_gpus=1.0 if cuda else 0.0,  # every side on the same device
        )

    cfg = config(primary)
    plain = copy.deepcopy(model).to(device)
    use_float_head(plain)
    reference = copy.deepcopy(plain).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(plain.parameters(), lr=cfg.lr, weight_decay=0.0, fused=True)
    trainers = {dtype: PolicyTrainer(copy.deepcopy(model), config(dtype), pad_id) for dtype in arms}
    torch_batches = iter(range(10**9))  # the trainer's schedule seeds: seed 0 + batches trained
    compute = getattr(torch, primary)
    runs = {
        "torch": lambda: torch_step(
            plain, reference, optimizer, samples, cfg, pad_id, device, next(torch_batches), compute
        ),
    }
    stats: dict[str, list] = {dtype: [] for dtype in arms}
    for dtype in arms:
        runs[dtype] = lambda dtype=dtype: stats[dtype].append(trainers[dtype].train_step(samples))
    for _ in range(warmup_steps):
        for run in runs.values():
            run()
    # Interleaved, so load from other processes on a shared machine hits every side alike.
    timings: dict[str, list[float]] = {side: [] for side in runs}
    transient = dict.fromkeys(runs, 0)
    for _ in range(steps):
        measure_peaks()
        for side, run in runs.items():
            seconds, peak = timed_with_peak(run, cuda)
            timings[side].append(seconds)
            transient[side] = max(transient[side], peak)
    seconds = {side: float(np.median(values)) for side, values in timings.items()}
    flops = model_flops(model, samples, cfg, seed=0)
    limit = max(peaks.values())
    measured = stats[primary][warmup_steps:]
    return {
        "model": model_name,
        "device": str(device),
        "zero_stage": zero_stage,
        "compute_dtype": primary,
        "bf16_native": native,
        "batch_size": batch_size,
        "sequence_tokens": prompt_tokens + response_tokens,
        "tokens_per_step": tokens,
        "steps": steps,
        "optimizer_steps_per_batch": measured[-1].optimizer_steps,
        "clip_fraction": float(np.mean([step.clip_fraction for step in measured])),
        "approx_kl": float(np.mean([step.approx_kl for step in measured])),
        "tokens_per_s": tokens / seconds[primary],
        "torch_tokens_per_s": tokens / seconds["torch"],
        "ratio": seconds["torch"] / seconds[primary],
        "step_seconds": seconds[primary],
        "torch_step_seconds": seconds["torch"],
        "matmul_tflops": peaks,
        "model_tflop_per_step": flops / 1e12,
        "achieved_tflops": flops / seconds[primary] / 1e12,
        "mfu": flops / seconds[primary] / 1e12 / limit,
        "mfu_peak_dtype": max(peaks, key=peaks.get),
        "bf16_over_fp32": seconds["float32"] / seconds["bfloat16"] if native else None,
        "bf16_skipped": None
        if native
        else f"no native bf16 on this {device.type} (bf16 matmul {peaks['bfloat16']:.4f} TFLOP/s against "
        f"{peaks['float32']:.3f} in fp32): auto computes in fp32 here",
        "peak_memory_mb": (resident_bytes(trainers[primary].module, trainers[primary].optimizer) + transient[primary])
        / 2**20,
        "torch_peak_memory_mb": (resident_bytes(plain, optimizer) + transient["torch"]) / 2**20,
    }
