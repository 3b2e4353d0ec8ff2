"""The DeepSpeed policy trainer: PPO mini-batch updates per learner batch, micro-batched by tokens.

One process on one machine needs no launcher: `init_distributed` fills in the rendezvous
variables torchrun would set. With several ranks (torchrun, or Ray actors that set the same
variables), every rank receives the whole batch and trains its share of each mini-batch's
micro-batches; DeepSpeed averages the gradients.

One learner batch is `learner.ppo_epochs` passes over `learner.mini_batches` mini-batches, one
optimizer step each, as PPO trains (verl's ppo_mini_batch_size / ppo_epochs, OpenRLHF's
micro/mini batches). Decoupled PPO (AReaL) needs three policies: the behaviour policy is the
actor's recorded log-probs; the proximal policy is the learner's weights *before this batch's
first optimizer step*, scored once by a no-grad forward (`_score_before_updates`); the current
policy moves with every step, so from the second mini-batch on the ratio current / proximal
leaves 1 and the clip acts. The frozen reference (KL term) and the EDGE teacher (the proximal
weights under the teacher prompt, learner/edge.py) are scored in the same pass, once per batch
rather than once per epoch.

Mini-batch membership is drawn once per batch (a seeded permutation, the same on every rank) and
kept across epochs, so each rank scores only the rows it will train; each epoch visits the
mini-batches in a new order.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist

from learner.batch import MicroBatch, TrainSample, collate, plan_micro_batches, ppo_schedule, response_logits
from learner.device import training_device
from learner.edge import distill_advantages, distill_log_ratio
from learner.loss import gather_logprobs, ppo_loss, token_entropy
from learner.weights import cpu_copy
from slea.config import LearnerConfig
from slea.ports import free_port


def init_distributed() -> tuple[int, int]:
    """Join (or create) the process group: NCCL on GPU, gloo on CPU; returns (rank, world size)."""
    if not dist.is_initialized():
        for name, default in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(name, default)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if os.environ["WORLD_SIZE"] != "1":  # launched by torchrun / a multi-rank launcher: use its rendezvous
            deepspeed.init_distributed(dist_backend=backend)
        else:
            _init_single_process(backend)
    return dist.get_rank(), dist.get_world_size()


def _init_single_process(backend: str, attempts: int = 3) -> None:
    """A lone learner rendezvouses with itself on a fresh loopback port. Never a MASTER_PORT
    inherited from a parent process (that port may still be held there), and another pick if
    the port was taken between choosing and binding it."""
    for attempt in range(attempts):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
        try:
            deepspeed.init_distributed(dist_backend=backend)
            return
        except dist.DistNetworkError:
            if attempt == attempts - 1:
                raise


def deepspeed_config(cfg: LearnerConfig, world_size: int, bf16: bool) -> dict:
    """The whole DeepSpeed config as a plain dict (as OpenRLHF's deepspeed_utils does).

    Gradient accumulation is driven by the trainer (the number of micro-batches follows the
    token budget, so it changes every step); DeepSpeed sees one micro-batch per step and the
    trainer marks the accumulation boundary itself.
    """
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": cfg.grad_clip,
        "steps_per_print": 10**9,  # metrics go through our own dict, not DeepSpeed's logger
        "wall_clock_breakdown": False,
        "bf16": {"enabled": bf16},
        "zero_optimization": {
            "stage": cfg.zero_stage,
            "overlap_comm": torch.cuda.is_available(),
            "contiguous_gradients": True,
            "reduce_bucket_size": 5e7,
            "stage3_param_persistence_threshold": 1e4,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    }


@dataclass
class StepStats:
    """What one learner batch did: means over its optimizer steps of each step's token mean."""

    loss: float  # total loss
    pg_loss: float  # clipped surrogate term
    kl: float  # k3 KL to the reference (0 without one)
    entropy: float  # mean token entropy
    clip_fraction: float  # share of tokens where PPO clipping was active
    approx_kl: float  # k3 estimate of KL(proximal || current): how far the updates moved the policy
    behav_masked_fraction: float  # share of tokens masked for a too large behaviour weight
    behav_weight: float  # mean behaviour -> proximal importance weight (masked count 0)
    grad_norm: float  # global gradient norm before clipping, mean over the optimizer steps
    lr: float  # learning rate of the batch's first optimizer step
    tokens: int  # real tokens (prompt + response) in the batch, all ranks
    response_tokens: int  # response tokens trained on, all ranks
    optimizer_steps: int  # optimizer steps taken on this batch (mini_batches x ppo_epochs)
    micro_batches: int  # micro-batch forward/backward passes this rank ran (all epochs)
    seconds: float  # wall time of the whole batch, scoring pass included
    edge_kl: float = 0.0  # EDGE: mean log pi_student - log pi_teacher over distilled tokens (sampled reverse KL)
    edge_token_fraction: float = 0.0  # EDGE: share of response tokens distilled


@dataclass
class _Scored:
    """One micro-batch with its no-grad log-probs from before the batch's first update."""

    batch: MicroBatch  # the collated rows
    real: bool  # False: a repeat that only keeps the ranks' collectives in step (loss weight 0)
    proximal: torch.Tensor  # [B, Rmax] log-probs under the weights before the first optimizer step
    reference: torch.Tensor | None  # [B, Rmax] under the frozen reference (None without the KL term)
    teacher: torch.Tensor | None  # [B, Rmax] EDGE: proximal weights under the teacher prompt (None: not distilling)
    distilled_rows: torch.Tensor | None  # float [B] EDGE: 1 on rows that carry a teacher prompt


LOSS_TERMS = ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "approx_kl", "behav_masked_fraction", "behav_weight")


class PolicyTrainer:
    """A causal LM inside a DeepSpeed engine, plus the frozen reference for the KL term."""

    def __init__(
        self, model: torch.nn.Module, cfg: LearnerConfig, pad_id: int, temperature: float = 1.0, seed: int = 0
    ):
        self.cfg = cfg
        self.pad_id = pad_id
        self.temperature = temperature  # the actors' sampling temperature: log-probs are of pi_T, as sampled
        self.seed = seed  # mini-batch draws: seed + batch count, identical on every rank
        self.batches_trained = 0
        self.rank, self.world_size = init_distributed()
        self.device = training_device(cfg.num_gpus)  # what Ray assigned, memory capped when shared (learner/device.py)
        on_gpu = self.device.type == "cuda"
        model.config.use_cache = False
        # The reference is the policy as loaded: frozen, never stepped, inference only.
        self.reference = (
            _frozen_copy(model, self.device, torch.bfloat16 if on_gpu else None) if cfg.kl_coef > 0 else None
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0, fused=on_gpu)
        warmup = cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=deepspeed_config(cfg, self.world_size, bf16=on_gpu),
        )

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def train_step(self, samples: list[TrainSample]) -> StepStats:
        """PPO on one learner batch (every rank passes the same list): score, then mini-batch updates."""
        start = time.perf_counter()
        mini_batches, steps = ppo_schedule(
            len(samples), self.cfg.mini_batches, self.cfg.ppo_epochs, self.seed + self.batches_trained
        )
        self.batches_trained += 1
        # Same decision on every rank (same samples): under ZeRO-3 the teacher forward is a collective too.
        distilling = self.cfg.edge_distill_coef > 0 and any(len(sample.teacher_prompt_ids) for sample in samples)
        lr = self.scheduler.get_last_lr()[0]  # the scheduler advances inside engine.step()
        self.engine.train()
        scored = [self._score_before_updates([samples[i] for i in rows], distilling) for rows in mini_batches]
        sums = dict.fromkeys(LOSS_TERMS, 0.0) | dict(edge_kl_sum=0.0, edge_tokens=0.0, grad_norm=0.0)
        passes = 0
        for index in steps:
            step_sums, grad_norm = self._optimizer_step(scored[index], [samples[i] for i in mini_batches[index]])
            for name, value in step_sums.items():
                sums[name] += value
            sums["grad_norm"] += grad_norm
            passes += len(scored[index])
        optimizer_steps = len(steps)
        summed = self._sum_over_ranks({name: sums.pop(name) for name in (*LOSS_TERMS, "edge_kl_sum", "edge_tokens")})
        edge_kl_sum, edge_tokens = summed.pop("edge_kl_sum"), summed.pop("edge_tokens")
        total_response = sum(len(sample.response_ids) for sample in samples)
        return StepStats(
            **{name: value / optimizer_steps for name, value in summed.items()},
            edge_kl=edge_kl_sum / edge_tokens if edge_tokens else 0.0,
            edge_token_fraction=edge_tokens / (total_response * self.cfg.ppo_epochs) if total_response else 0.0,
            grad_norm=sums["grad_norm"] / optimizer_steps,
            lr=lr,
            tokens=sum(sample.length for sample in samples),
            response_tokens=total_response,
            optimizer_steps=optimizer_steps,
            micro_batches=passes,
            seconds=time.perf_counter() - start,
        )

    @torch.no_grad()
    def _score_before_updates(self, rows: list[TrainSample], distilling: bool) -> list[_Scored]:
        """This rank's micro-batches of one mini-batch, with the proximal (and reference, teacher)
        log-probs of the weights as they are now. Every rank scores the same number of micro-batches
        (ZeRO collectives); a rank short of real ones repeats one, with loss weight 0."""
        plan = plan_micro_batches([row.length for row in rows], self.cfg.micro_batch_tokens)
        mine = plan[self.rank :: self.world_size]
        scored = []
        for index in range(math.ceil(len(plan) / self.world_size)):
            real = index < len(mine)
            chunk = [rows[i] for i in (mine[index] if real else plan[0])]
            batch = collate(chunk, self.pad_id, self.device)
            proximal = gather_logprobs(response_logits(self.engine, batch, self.temperature), batch.response_ids)
            reference = teacher = distilled_rows = None
            if self.reference is not None:
                reference = gather_logprobs(
                    response_logits(self.reference, batch, self.temperature), batch.response_ids
                )
            if distilling:
                teacher_batch, distilled_rows = _teacher_batch(chunk, self.pad_id, self.device)
                teacher = gather_logprobs(
                    response_logits(self.engine, teacher_batch, self.temperature), batch.response_ids
                )
            scored.append(_Scored(batch, real, proximal, reference, teacher, distilled_rows))
        return scored

    def _optimizer_step(self, scored: list[_Scored], rows: list[TrainSample]) -> tuple[dict[str, float], float]:
        """One optimizer step on one mini-batch: its token-mean loss, accumulated over this rank's
        micro-batches. Returns this rank's summed loss terms and the gradient norm before clipping."""
        total_response = sum(len(row.response_ids) for row in rows)  # the mini-batch's, all ranks
        sums = dict.fromkeys(LOSS_TERMS, 0.0) | dict(edge_kl_sum=0.0, edge_tokens=0.0)
        grad_norm = None
        for index, micro in enumerate(scored):
            terms, edge_kl_sum, edge_tokens = self._micro_batch_loss(micro, total_response)
            # DeepSpeed averages gradients over ranks; the loss is already a mini-batch-wide token sum.
            self.engine.set_gradient_accumulation_boundary(index == len(scored) - 1)
            self.engine.backward(terms.loss * (float(self.world_size) if micro.real else 0.0))
            if index == len(scored) - 1 and self.cfg.zero_stage == 0:
                # Stage 0 clips with torch and does not keep the norm; read it before the step.
                grad_norm = _grad_norm(self.engine.module)
            self.engine.step()
            if micro.real:
                for name in LOSS_TERMS:
                    sums[name] += float(getattr(terms, name).detach())
                sums["edge_kl_sum"] += edge_kl_sum
                sums["edge_tokens"] += edge_tokens
        if self.cfg.zero_stage > 0:
            grad_norm = self.engine.get_global_grad_norm()
        return sums, float(grad_norm) if grad_norm is not None else float("nan")

    def _micro_batch_loss(self, micro: _Scored, total_response: int):
        """(LossTerms, EDGE log-ratio sum, distilled tokens) of a micro-batch. With a teacher, the EDGE
        log-ratio joins the advantages (learner/edge.py)."""
        batch = micro.batch
        logits = response_logits(self.engine, batch, self.temperature)
        logprobs = gather_logprobs(logits, batch.response_ids)
        entropy = token_entropy(logits) if self.cfg.entropy_coef > 0 else None
        advantages, log_ratio, distill_mask = batch.advantages, None, None
        if micro.teacher is not None:
            distill_mask = batch.response_mask * micro.distilled_rows.unsqueeze(-1)
            log_ratio = distill_log_ratio(logprobs, micro.teacher, distill_mask)
            advantages = distill_advantages(advantages, log_ratio, self.cfg.edge_distill_coef)
        terms = ppo_loss(
            logprobs,
            micro.proximal,
            batch.behaviour_logprobs,
            advantages,
            batch.response_mask,
            clip_low=self.cfg.clip_low,
            clip_high=self.cfg.clip_high,
            behav_weight_cap=self.cfg.behav_weight_cap,
            ref_logprobs=micro.reference,
            kl_coef=self.cfg.kl_coef,
            entropy=entropy,
            entropy_coef=self.cfg.entropy_coef,
            total_tokens=total_response,
        )
        if log_ratio is None:
            return terms, 0.0, 0.0
        return terms, float(log_ratio.sum()), float(distill_mask.sum())

    def _sum_over_ranks(self, sums: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return sums
        values = torch.tensor(list(sums.values()), dtype=torch.float64, device=self.device)
        dist.all_reduce(values)
        return dict(zip(sums, values.tolist()))

    @torch.no_grad()
    def logprobs(self, samples: list[TrainSample]) -> list[torch.Tensor]:
        """Current-policy log-probs of each sample's response tokens (for checks and metrics)."""
        self.engine.eval()
        result = []
        for sample in samples:
            batch = collate([sample], self.pad_id, self.device)
            values = gather_logprobs(response_logits(self.engine, batch, self.temperature), batch.response_ids)[0]
            result.append(values[values.shape[0] - len(sample.response_ids) :].cpu())
        return result

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All weights as full CPU tensors on every rank (ZeRO-3 partitions are gathered)."""
        module = self.engine.module
        if self.cfg.zero_stage == 3:
            # Gather the whole model at once: state_dict() then also names tied weights (lm_head).
            with deepspeed.zero.GatheredParameters(list(module.parameters())):
                return cpu_copy(module.state_dict())
        return cpu_copy(module.state_dict())  # tied weights stay one tensor: sent once (learner/weights.py)


def _teacher_batch(rows: list[TrainSample], pad_id: int, device: torch.device) -> tuple[MicroBatch, torch.Tensor]:
    """The rows with their teacher prompts (rows without one keep their own prompt, and are masked out
    of the distillation), and a float [B] flag of the distilled rows. Responses are the same tokens,
    right-aligned in the same slots, so teacher and student log-probs line up position by position."""
    flags = [len(row.teacher_prompt_ids) > 0 for row in rows]
    teacher_rows = [
        dataclasses.replace(row, prompt_ids=row.teacher_prompt_ids) if flag else row for row, flag in zip(rows, flags)
    ]
    return collate(teacher_rows, pad_id, device), torch.tensor(flags, dtype=torch.float32, device=device)


def _grad_norm(module: torch.nn.Module) -> float:
    grads = [param.grad for param in module.parameters() if param.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def _frozen_copy(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None) -> torch.nn.Module:
    reference = copy.deepcopy(model).to(device)
    if dtype is not None:
        reference = reference.to(dtype)
    reference.eval()
    reference.requires_grad_(False)
    return reference
