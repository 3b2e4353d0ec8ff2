"""The DeepSpeed policy trainer: one optimizer step per learner step, micro-batched by tokens.

One process on one machine needs no launcher: `init_distributed` fills in the rendezvous
variables torchrun would set. With several ranks (torchrun, or Ray actors that set the same
variables), every rank receives the whole batch and trains its share of the micro-batches;
DeepSpeed averages the gradients.

One optimizer step per batch means the proximal policy of decoupled PPO is exactly the current
weights before the step, so its log-probs are the detached log-probs of the same forward pass:
no extra forward is needed, and the behaviour -> proximal weight carries all the staleness
correction. EDGE distillation (`learner.edge_distill_coef`) adds one no-grad forward per
micro-batch, of the same responses under their teacher prompts (learner/edge.py).
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

from learner.batch import MicroBatch, TrainSample, collate, plan_micro_batches, response_logits
from learner.edge import distill_advantages, distill_log_ratio
from learner.loss import gather_logprobs, ppo_loss, token_entropy
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
    """What one optimizer step did; token means over the whole batch."""

    loss: float  # total loss
    pg_loss: float  # clipped surrogate term
    kl: float  # k3 KL to the reference (0 without one)
    entropy: float  # mean token entropy
    clip_fraction: float  # share of tokens where PPO clipping was active
    behav_masked_fraction: float  # share of tokens masked for a too large behaviour weight
    behav_weight: float  # mean behaviour -> proximal importance weight (masked count 0)
    grad_norm: float  # global gradient norm before clipping
    lr: float  # learning rate used by this step
    tokens: int  # real tokens (prompt + response) forwarded, all ranks
    response_tokens: int  # response tokens trained on, all ranks
    micro_batches: int  # micro-batches this rank ran
    seconds: float  # wall time of the step
    edge_kl: float = 0.0  # EDGE: mean log pi_student - log pi_teacher over distilled tokens (sampled reverse KL)
    edge_token_fraction: float = 0.0  # EDGE: share of response tokens distilled


class PolicyTrainer:
    """A causal LM inside a DeepSpeed engine, plus the frozen reference for the KL term."""

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig, pad_id: int, temperature: float = 1.0):
        self.cfg = cfg
        self.pad_id = pad_id
        self.temperature = temperature  # the actors' sampling temperature: log-probs are of pi_T, as sampled
        self.rank, self.world_size = init_distributed()
        on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
        if on_gpu:
            torch.cuda.set_device(self.device)
        model.config.use_cache = False
        # The reference is the policy as loaded: frozen, never stepped, inference only.
        self.reference = _frozen_copy(model, self.device, torch.bfloat16 if on_gpu else None) if cfg.kl_coef > 0 else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0, fused=on_gpu)
        warmup = cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
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
        """One optimizer step on `samples` (every rank passes the same list)."""
        start = time.perf_counter()
        lengths = [sample.length for sample in samples]
        plan = plan_micro_batches(lengths, self.cfg.micro_batch_tokens)
        # Every rank must run the same number of forward/backward passes (ZeRO collectives);
        # a rank short of real micro-batches repeats one with zero weight.
        per_rank = math.ceil(len(plan) / self.world_size)
        mine = plan[self.rank :: self.world_size]
        total_response = sum(len(sample.response_ids) for sample in samples)
        lr = self.scheduler.get_last_lr()[0]  # what this step uses; the scheduler advances inside engine.step()
        sums = dict(loss=0.0, pg_loss=0.0, kl=0.0, entropy=0.0, clip_fraction=0.0, behav_masked_fraction=0.0, behav_weight=0.0)
        edge_sums = dict(edge_kl_sum=0.0, edge_tokens=0.0)  # EDGE distillation: summed log-ratios and their tokens
        # Same decision on every rank (same samples): under ZeRO-3 the teacher forward is a collective too.
        distilling = self.cfg.edge_distill_coef > 0 and any(len(sample.teacher_prompt_ids) for sample in samples)
        grad_norm = None
        self.engine.train()
        for index in range(per_rank):
            real = index < len(mine)
            rows = [samples[i] for i in (mine[index] if real else plan[0])]
            batch = collate(rows, self.pad_id, self.device)
            teacher = _teacher_batch(rows, self.pad_id, self.device) if distilling else None
            terms, edge_kl_sum, edge_tokens = self._micro_batch_loss(batch, total_response, teacher)
            # DeepSpeed averages gradients over ranks; the loss is already a batch-wide token sum.
            scale = float(self.world_size) if real else 0.0
            self.engine.set_gradient_accumulation_boundary(index == per_rank - 1)
            self.engine.backward(terms.loss * scale)
            if index == per_rank - 1 and self.cfg.zero_stage == 0:
                # Stage 0 clips with torch and does not keep the norm; read it before the step.
                grad_norm = _grad_norm(self.engine.module)
            self.engine.step()
            if real:
                for name in sums:
                    sums[name] += float(getattr(terms, name).detach())
                edge_sums["edge_kl_sum"] += edge_kl_sum
                edge_sums["edge_tokens"] += edge_tokens
        sums = self._sum_over_ranks(sums | edge_sums)
        edge_kl_sum, edge_tokens = sums.pop("edge_kl_sum"), sums.pop("edge_tokens")
        if self.cfg.zero_stage > 0:
            grad_norm = self.engine.get_global_grad_norm()
        return StepStats(
            **sums,
            edge_kl=edge_kl_sum / edge_tokens if edge_tokens else 0.0,
            edge_token_fraction=edge_tokens / total_response if total_response else 0.0,
            grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),
            lr=lr,
            tokens=sum(lengths),
            response_tokens=total_response,
            micro_batches=len(mine),
            seconds=time.perf_counter() - start,
        )

    def _micro_batch_loss(self, batch: MicroBatch, total_response: int, teacher: tuple[MicroBatch, torch.Tensor] | None = None):
        """(LossTerms, EDGE log-ratio sum, distilled tokens) of a micro-batch. With `teacher` (its teacher-prompt
        batch and a flag per distilled row) the EDGE log-ratio joins the advantages (learner/edge.py)."""
        teacher_logprobs = None
        if teacher is not None:
            with torch.no_grad():  # the teacher is the current policy under the teacher prompt: no gradient
                teacher_logprobs = gather_logprobs(response_logits(self.engine, teacher[0], self.temperature), batch.response_ids)
        logits = response_logits(self.engine, batch, self.temperature)
        logprobs = gather_logprobs(logits, batch.response_ids)
        entropy = token_entropy(logits) if self.cfg.entropy_coef > 0 else None
        ref_logprobs = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logprobs = gather_logprobs(response_logits(self.reference, batch, self.temperature), batch.response_ids)
        advantages, log_ratio, distill_mask = batch.advantages, None, None
        if teacher_logprobs is not None:
            distill_mask = batch.response_mask * teacher[1].unsqueeze(-1)
            log_ratio = distill_log_ratio(logprobs, teacher_logprobs, distill_mask)
            advantages = distill_advantages(advantages, log_ratio, self.cfg.edge_distill_coef)
        terms = ppo_loss(
            logprobs,
            logprobs.detach(),  # proximal = weights before this optimizer step (see module docstring)
            batch.behaviour_logprobs,
            advantages,
            batch.response_mask,
            clip_low=self.cfg.clip_low,
            clip_high=self.cfg.clip_high,
            behav_weight_cap=self.cfg.behav_weight_cap,
            ref_logprobs=ref_logprobs,
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
            result.append(values[values.shape[0] - len(sample.response_ids):].cpu())
        return result

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All weights as full CPU tensors on every rank (ZeRO-3 partitions are gathered)."""
        module = self.engine.module
        if self.cfg.zero_stage == 3:
            # Gather the whole model at once: state_dict() then also names tied weights (lm_head).
            with deepspeed.zero.GatheredParameters(list(module.parameters())):
                return {name: tensor.detach().to("cpu", copy=True) for name, tensor in module.state_dict().items()}
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in module.state_dict().items()}


def _teacher_batch(rows: list[TrainSample], pad_id: int, device: torch.device) -> tuple[MicroBatch, torch.Tensor]:
    """The rows with their teacher prompts (rows without one keep their own prompt, and are masked out
    of the distillation), and a float [B] flag of the distilled rows. Responses are the same tokens,
    right-aligned in the same slots, so teacher and student log-probs line up position by position."""
    flags = [len(row.teacher_prompt_ids) > 0 for row in rows]
    teacher_rows = [dataclasses.replace(row, prompt_ids=row.teacher_prompt_ids) if flag else row for row, flag in zip(rows, flags)]
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
