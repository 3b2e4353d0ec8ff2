"""`slea bench learner`: the DeepSpeed learner step against a plain PyTorch AdamW loop, same run.

Both sides train the same initial weights on the same samples with the same loss (decoupled
PPO, token-budget micro-batches, gradient clipping); only the wrapper differs, so the ratio
tokens_per_s / torch_tokens_per_s is what DeepSpeed costs (or saves). Machines here are noisy:
read the ratio, not the absolute figures. Peak memory is what each side keeps resident
(parameters, gradients, optimizer state) plus the largest transient growth during one of its
steps (activations, logits), since both live in one process.
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
from slea.config import LearnerConfig
from slea.models import load_model, tiny_model


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


def torch_step(
    model, reference, optimizer, samples: list[TrainSample], cfg: LearnerConfig, pad_id: int, device, seed: int
) -> None:
    """The same update as PolicyTrainer.train_step, written as a plain PyTorch loop: score every
    micro-batch with the weights before the first update (proximal, reference), then one
    optimizer step per mini-batch in the schedule's order."""
    mini_batches, steps = ppo_schedule(len(samples), cfg.mini_batches, cfg.ppo_epochs, seed)
    model.train()
    scored = []
    with torch.no_grad():
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
    """Tokens/s and peak memory of the DeepSpeed learner step vs a plain torch AdamW loop, both
    taking the same `mini_batches` PPO optimizer steps per batch.

    model_name "tiny" uses `slea.models.tiny_model` (a plumbing check, not a throughput figure).
    The learning rate does not change the cost; it is set high enough (1e-5, the learning configs')
    that the later mini-batches move the policy past the clip range, so `clip_fraction` shows the
    PPO clip at work.
    """
    model, tokenizer = tiny_model() if model_name == "tiny" else load_model(model_name)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    cfg = LearnerConfig(
        zero_stage=zero_stage,
        micro_batch_tokens=micro_batch_tokens,
        mini_batches=mini_batches,
        lr=lr,
        num_gpus=1.0 if device.type == "cuda" else 0.0,  # both sides on the same device
    )
    samples = synthetic_samples(batch_size, prompt_tokens, response_tokens, model.config.vocab_size)
    tokens = sum(sample.length for sample in samples)
    pad_id = tokenizer.pad_token_id

    plain = copy.deepcopy(model).to(device)
    reference = copy.deepcopy(model).to(device).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.AdamW(plain.parameters(), lr=cfg.lr, weight_decay=0.0)
    trainer = PolicyTrainer(model, cfg, pad_id)
    torch_batches = iter(range(10**9))  # the trainer's schedule seeds: seed 0 + batches trained
    run_torch = lambda: torch_step(plain, reference, optimizer, samples, cfg, pad_id, device, next(torch_batches))  # noqa: E731
    deepspeed_stats = []
    run_deepspeed = lambda: deepspeed_stats.append(trainer.train_step(samples))  # noqa: E731
    for _ in range(warmup_steps):
        run_torch()
        run_deepspeed()
    # Interleaved, so load from other processes on a shared machine hits both sides alike.
    timings: dict[str, list[float]] = {"torch": [], "deepspeed": []}
    transient = {"torch": 0, "deepspeed": 0}
    for _ in range(steps):
        for side, run in (("torch", run_torch), ("deepspeed", run_deepspeed)):
            with StepMemory() as memory:
                start = time.perf_counter()
                run()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timings[side].append(time.perf_counter() - start)
            transient[side] = max(transient[side], memory.peak_bytes)
    torch_seconds, ds_seconds = float(np.median(timings["torch"])), float(np.median(timings["deepspeed"]))
    torch_memory = resident_bytes(plain, optimizer) + transient["torch"]
    ds_memory = resident_bytes(trainer.module, trainer.optimizer) + transient["deepspeed"]
    return {
        "model": model_name,
        "device": str(device),
        "zero_stage": zero_stage,
        "batch_size": batch_size,
        "sequence_tokens": prompt_tokens + response_tokens,
        "tokens_per_step": tokens,
        "steps": steps,
        "optimizer_steps_per_batch": deepspeed_stats[-1].optimizer_steps,
        "clip_fraction": float(np.mean([stats.clip_fraction for stats in deepspeed_stats[warmup_steps:]])),
        "approx_kl": float(np.mean([stats.approx_kl for stats in deepspeed_stats[warmup_steps:]])),
        "tokens_per_s": tokens / ds_seconds,
        "torch_tokens_per_s": tokens / torch_seconds,
        "ratio": torch_seconds / ds_seconds,
        "step_seconds": ds_seconds,
        "torch_step_seconds": torch_seconds,
        "peak_memory_mb": ds_memory / 2**20,
        "torch_peak_memory_mb": torch_memory / 2**20,
    }
