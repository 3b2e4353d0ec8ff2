"""The DeepSpeed policy trainer: PPO mini-batch updates per learner batch, micro-batched by tokens.

One process on one machine needs no launcher: `init_distributed` forms a group of one on an
in-process store. With several ranks (torchrun, or Ray actors meeting on rank 0's store), every
rank receives the whole batch and trains its share of each mini-batch's micro-batches; DeepSpeed
averages the gradients.

One learner batch is `learner.ppo_epochs` passes over `learner.mini_batches` mini-batches, one
optimizer step each, as PPO trains (verl's ppo_mini_batch_size / ppo_epochs, OpenRLHF's
micro/mini batches). Decoupled PPO (AReaL) needs three policies: the behaviour policy is the
actor's recorded log-probs; the proximal policy is the learner's weights *before this batch's
first optimizer step*, scored once by a no-grad forward (`_score_before_updates`), except for the
mini-batch of the first step, whose own forwards run before any weight moves and so are the
proximal log-probs (train_step); the current
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
import sys
import time
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist

from learner.batch import MicroBatch, TrainSample, collate, plan_micro_batches, ppo_schedule, response_logits
from learner.device import training_device
from learner.edge import distill_advantages, distill_log_ratio
from learner.loss import gather_logprobs, ppo_loss, token_entropy
from learner.memory import count_for, device_budget, reference_dtype, refuse_unless_it_fits
from learner.precision import compute_context, deepspeed_autocast_section, use_float_head
from learner.state_copy import cpu_copy
from slea.config import LearnerConfig
from slea.precision import resolve_dtype


def use_the_ninja_of_this_python() -> None:
    """Put the directory of this Python's `ninja` first on PATH.

    DeepSpeed JIT-compiles its CPU shared-memory comm op when its comm starts, in one build
    directory per user (~/.cache/torch_extensions), with whichever `ninja` PATH finds. A process
    whose PATH has a system ninja first (1.11 here) and one that finds the pip ninja installed
    with DeepSpeed (1.13) write build logs of different versions; each discards the other's log
    and recompiles the op, about 40 s of two cores, on every switch. Ray workers of a cluster
    started from the venv's `ray` find one, those of an in-process `ray.init()` the other: the
    test suite switched many times a run. One ninja, the one beside this interpreter, ends it."""
    bin_dir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if os.path.isfile(os.path.join(bin_dir, "ninja")) and path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + path


def init_distributed(store: dist.Store | None = None) -> tuple[int, int]:
    """Join (or create) the process group: NCCL on GPU, gloo on CPU; returns (rank, world size).

    The ranks of a multi-rank learner meet on `store` (rank 0 hosts it on its node's address
    only: learner/process.py); torchrun's ranks (WORLD_SIZE set, no store) on its env://
    rendezvous. A lone learner needs no rendezvous: its group forms on an in-process store, so
    it opens no port for one (and never reuses a MASTER_PORT a parent process may still hold)."""
    if not dist.is_initialized():
        use_the_ninja_of_this_python()
        for name, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(name, default)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if store is None and world_size == 1:
            store = dist.HashStore()
        if store is not None:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        deepspeed.init_distributed(dist_backend=backend)  # DeepSpeed's comm: on the group above, or torchrun's env://
    return dist.get_rank(), dist.get_world_size()


def deepspeed_config(cfg: LearnerConfig, world_size: int, compute_dtype: torch.dtype) -> dict:
    """The whole DeepSpeed config as a plain dict (as OpenRLHF's deepspeed_utils does).

    Gradient accumulation is driven by the trainer (the number of micro-batches follows the
    token budget, so it changes every step); DeepSpeed sees one micro-batch per step and the
    trainer marks the accumulation boundary itself.

    Precision (learner/precision.py): DeepSpeed's `bf16` section stays off, so the module's
    parameters stay float32 and are the master weights; bf16 compute is autocast
    (`torch_autocast`), and gradients accumulate in float32 (`grad_accum_dtype`, said outright:
    with bf16 parameters DeepSpeed would default it to bf16). ZeRO-0 leaves clipping to the
    trainer, which reads the norm from the same pass (`gradient_clipping` 0 here).
    """
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": cfg.grad_clip if cfg.zero_stage > 0 else 0.0,
        "steps_per_print": 10**9,  # metrics go through our own dict, not DeepSpeed's logger
        "wall_clock_breakdown": False,
        "bf16": {"enabled": False},
        "torch_autocast": deepspeed_autocast_section(compute_dtype),
        "data_types": {"grad_accum_dtype": "fp32"},
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
    behav_abs_log_diff: float  # mean |log pi_prox - log pi_behav| per token: how far the actors' numbers are off
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
    proximal: torch.Tensor | None  # [B, Rmax] log-probs under the weights before the first optimizer step
    # (None until the first optimizer step's own forward fills it in: see train_step)
    reference: torch.Tensor | None  # [B, Rmax] under the frozen reference (None without the KL term)
    teacher: torch.Tensor | None  # [B, Rmax] EDGE: proximal weights under the teacher prompt (None: not distilling)
    distilled_rows: torch.Tensor | None  # float [B] EDGE: 1 on rows that carry a teacher prompt


LOSS_TERMS = (
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "behav_masked_fraction",
    "behav_weight",
    "behav_abs_log_diff",
)


class PolicyTrainer:
    """A causal LM inside a DeepSpeed engine, plus the frozen reference for the KL term."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: LearnerConfig,
        pad_id: int,
        temperature: float = 1.0,
        seed: int = 0,
        longest_row: int = 0,  # model.max_prompt_tokens + model.max_new_tokens: the memory count's micro-batch
    ):
        self.cfg = cfg
        self.pad_id = pad_id
        self.temperature = temperature  # the actors' sampling temperature: log-probs are of pi_T, as sampled
        self.seed = seed  # mini-batch draws: seed + batch count, identical on every rank
        self.batches_trained = 0
        self.rank, self.world_size = init_distributed()
        self.device = training_device(cfg.num_gpus)  # what Ray assigned, memory capped when shared (learner/device.py)
        self.compute_dtype = getattr(torch, resolve_dtype(cfg.compute_dtype, self.device.type))
        if any(param.dtype != torch.float32 for param in model.parameters()):
            raise ValueError(
                "the learner steps float32 master weights: load the policy in float32 "
                f"(learner.compute_dtype={cfg.compute_dtype} sets the compute dtype)"
            )
        # Counted before anything lands on the device: a setting that cannot fit stops here, naming the
        # term that overflows, not minutes later with an out-of-memory error mid-step.
        self.memory = count_for(
            model, cfg, world_size=self.world_size, compute_dtype=self.compute_dtype, longest_row=longest_row
        )
        refuse_unless_it_fits(self.memory, device_budget(self.device, cfg.num_gpus), str(self.device))
        model.config.use_cache = False
        use_float_head(model)
        if cfg.activation_checkpointing:
            # Non-reentrant: the recomputation sees the autocast state and the RNG of the first pass.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # The reference is the policy as loaded: frozen, never stepped, inference only, computed as the
        # policy is; its weights in learner.reference_dtype (auto: the compute dtype).
        held_as = reference_dtype(cfg, self.compute_dtype)
        self.reference = None if held_as is None else _frozen_copy(model, self.device, held_as)
        # Fused AdamW: one kernel over all parameters, on the CPU too (torch's CPU AdamW is otherwise a
        # per-tensor loop). Same update as the unfused one (tests/learner/test_precision.py).
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0, fused=True)
        warmup = cfg.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=deepspeed_config(cfg, self.world_size, self.compute_dtype),
        )
        if self.world_size == 1 and cfg.zero_stage == 0:
            self.engine.enable_backward_allreduce = False  # an all-reduce over one rank only copies the gradients

    def _compute(self):
        return compute_context(self.device, self.compute_dtype)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def train_step(self, samples: list[TrainSample]) -> StepStats:
        """PPO on one learner batch (every rank passes the same list): score, then mini-batch updates.

        The mini-batch of the first optimizer step is not scored in advance: its micro-batches all
        run before any weight moves, so their own forwards *are* the proximal policy, taken as they
        pass (exactly: its ratio is 1 by construction). The others are scored by one no-grad pass.
        """
        start = time.perf_counter()
        mini_batches, steps = ppo_schedule(
            len(samples), self.cfg.mini_batches, self.cfg.ppo_epochs, self.seed + self.batches_trained
        )
        self.batches_trained += 1
        # Same decision on every rank (same samples): under ZeRO-3 the teacher forward is a collective too.
        distilling = self.cfg.edge_distill_coef > 0 and any(len(sample.teacher_prompt_ids) for sample in samples)
        lr = self.scheduler.get_last_lr()[0]  # the scheduler advances inside engine.step()
        self.engine.train()
        scored = [
            self._score_before_updates([samples[i] for i in rows], distilling, proximal=index != steps[0])
            for index, rows in enumerate(mini_batches)
        ]
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
    def _score_before_updates(self, rows: list[TrainSample], distilling: bool, proximal: bool) -> list[_Scored]:
        """This rank's micro-batches of one mini-batch, with the reference and teacher log-probs of the
        weights as they are now, and the proximal ones when `proximal` (else the first update fills
        them in). Every rank scores the same number of micro-batches (ZeRO collectives); a rank short
        of real ones repeats one, with loss weight 0."""
        plan = plan_micro_batches([row.length for row in rows], self.cfg.micro_batch_tokens)
        mine = plan[self.rank :: self.world_size]
        scored = []
        for index in range(math.ceil(len(plan) / self.world_size)):
            real = index < len(mine)
            chunk = [rows[i] for i in (mine[index] if real else plan[0])]
            batch = collate(chunk, self.pad_id, self.device)
            proximal_logprobs = reference = teacher = distilled_rows = None
            with self._compute():
                if proximal:
                    proximal_logprobs = self._logprobs(self.engine, batch)
                if self.reference is not None:
                    reference = self._logprobs(self.reference, batch)
                if distilling:
                    teacher, distilled_rows = self._teacher_logprobs(chunk, batch)
            scored.append(_Scored(batch, real, proximal_logprobs, reference, teacher, distilled_rows))
        return scored

    def _logprobs(self, model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
        return gather_logprobs(response_logits(model, batch, self.temperature), batch.response_ids)

    def _teacher_logprobs(self, chunk: list[TrainSample], batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """EDGE: the proximal weights' log-probs of each response under its row's teacher prompt, [B, Rmax]
        aligned with `batch` (0 on rows without one), and the float [B] flag of the distilled rows. Only
        the distilled rows are run through the model."""
        flags = [len(row.teacher_prompt_ids) > 0 for row in chunk]
        distilled_rows = torch.tensor(flags, dtype=torch.float32, device=self.device)
        teacher = torch.zeros_like(batch.behaviour_logprobs)
        distilled = [i for i, flag in enumerate(flags) if flag]
        if distilled:  # responses are right-aligned: the teacher's last columns are the batch's last columns
            teacher_batch = collate(
                [dataclasses.replace(chunk[i], prompt_ids=chunk[i].teacher_prompt_ids) for i in distilled],
                self.pad_id,
                self.device,
            )
            width = teacher_batch.response_ids.shape[1]
            rows = torch.tensor(distilled, device=self.device)
            teacher[rows, teacher.shape[1] - width :] = self._logprobs(self.engine, teacher_batch)
        return teacher, distilled_rows

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
                # ZeRO-0: clip here, with the norm from the same pass (DeepSpeed's clipping is off).
                grad_norm = torch.nn.utils.clip_grad_norm_(self.engine.module.parameters(), self.cfg.grad_clip)
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
        with self._compute():
            logits = response_logits(self.engine, batch, self.temperature)
        logprobs = gather_logprobs(logits, batch.response_ids)
        if micro.proximal is None:  # the batch's first update: its own forward is the proximal policy
            micro.proximal = logprobs.detach()
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
            with self._compute():
                values = self._logprobs(self.engine, batch)[0]
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


def _frozen_copy(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    reference = copy.deepcopy(model).to(device, dtype)
    reference.eval()
    reference.requires_grad_(False)
    return reference
