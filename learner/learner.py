"""The learner loop: consume -> assemble groups -> advantages -> PPO step -> publish -> checkpoint -> ack.

Acknowledgement discipline: an entry is acknowledged when it was dropped on purpose (abandoned,
timed out, stale, late duplicate) or when the checkpoint holding the update that used it is on
disk. A learner that dies in between re-reads those entries from its pending list on restart,
resumes from the checkpoint and trains on them once; the version line continues after the
latest published version, even when the whole Ray cluster (and the weight registry with it) is
gone (see learner/weights.py `resume_version`), so a version number never names two policies.

Several ranks (`learner.num_ranks` Ray actors, or torchrun): rank 0 runs this loop alone and
orders the others through every collective (learner/ranks.py); each trains its share of the
micro-batches and DeepSpeed averages the gradients, so N ranks make the update one rank would.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from learner.admission_report import AdmissionReport
from learner.advantages import advantage_parts
from learner.batch import TrainSample
from learner.checkpoint import LearnerState, latest_checkpoint, load_checkpoint, save_checkpoint
from learner.edge import edge_metrics, select_teachers
from learner.engine import PolicyTrainer
from learner.groups import GroupAssembler, ReadyGroup
from learner.metrics_export import export_step_metrics
from learner.ranks import Order, RankChannel
from learner.weights import RayWeightPublisher, VersionRecord, resume_version
from slea.config import SleaConfig
from slea.models import load_model
from slea.redis_conn import connect
from slea.streams import StreamConsumer

GROUP = "learner"
log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """What one learner step trained on and measured."""

    metrics: dict  # flat numbers plus two histograms (see Learner.step)
    group_ids: list[str]  # the task groups trained on


class Learner:
    """Owns the policy: trains it from the step stream and publishes each new version."""

    def __init__(self, cfg: SleaConfig, *, redis_client=None, model=None, tokenizer=None):
        self.cfg = cfg
        if model is None:
            model, tokenizer = load_model(cfg.model.name)  # float32: the master weights
        self.tokenizer = tokenizer
        self.trainer = PolicyTrainer(
            model,
            cfg.learner,
            pad_id=tokenizer.pad_token_id,
            temperature=cfg.model.temperature,
            seed=cfg.run.seed,
            longest_row=cfg.model.max_prompt_tokens + cfg.model.max_new_tokens,
        )
        self.ranks = RankChannel(self.trainer.rank, self.trainer.world_size)
        self.checkpoint_root = Path(cfg.run.dir) / cfg.run.id / "learner" / "checkpoints"
        self.trace_path = self.checkpoint_root.parent / "trained_groups.jsonl"
        self.stop_requested = threading.Event()
        start = None
        if self.ranks.leader:  # the other ranks never touch Redis or the weight registry (learner/ranks.py)
            client = redis_client if redis_client is not None else connect(cfg.redis)
            self.publisher = RayWeightPublisher(
                cfg.run.id,
                cfg.learner.weight_transport,
                cfg.learner.weight_push_timeout_s,
                record=VersionRecord(client, cfg.run.id, cfg.redis.reconnect_max_s),
                device=self.trainer.device,
            )
            self.consumer = StreamConsumer(
                client,
                cfg.stream_key(),
                group=GROUP,
                consumer="learner-0",
                dead_letter_key=cfg.dead_letter_key(),
                max_deliveries=cfg.redis.max_deliveries,
                claim_idle_ms=cfg.redis.claim_idle_ms,  # never reclaims the entries it holds itself
                reconnect_max_s=cfg.redis.reconnect_max_s,
            )
            self.assembler = GroupAssembler(
                cfg.actors.group_size, cfg.learner.group_timeout_s, cfg.learner.max_staleness
            )
            self.unacked: list[str] = []  # entries used by updates not yet checkpointed
            self.admission = AdmissionReport(client, cfg.run.id, cfg.redis.reconnect_max_s)
            self._drops_reported = 0  # of the assembler's dropped groups, those added to the admission hash
            start = (
                latest_checkpoint(self.checkpoint_root),
                self.publisher.latest_version(),
                self.publisher.record.latest(),
            )
        # Every rank resumes from the checkpoint rank 0 picked (each loads its own ZeRO partition and RNG).
        previous, registry, recorded = self.ranks.share(start)

        state = LearnerState(version=0, learner_step=0)
        if previous is not None:
            state = load_checkpoint(self.trainer, previous)
            if self.ranks.leader:
                self.consumer.ack(state.applied_entry_ids)  # their effect is in the checkpoint
        self.learner_step = state.learner_step
        self.groups_trained = state.groups_trained
        resumed = resume_version(state.version, registry, recorded)
        self.version = resumed.version
        if resumed.publish:
            self._publish()
            if self.version > state.version and self.ranks.leader:
                self._trace([], restored=True)  # the checkpoint's weights under a new number: part of the line
        if self.ranks.leader:  # a restart rolls back what its checkpoint does not hold
            self.admission.trained(self.groups_trained, self.version)
        self._idle_since = time.monotonic()  # end of the latest step (or of start-up): wait_seconds counts from here
        self._lost_checked = self._idle_since  # when lost admission slots were last looked for
        # When to look for forgotten pending entries next (StreamConsumer.reclaim_forgotten): not before
        # read() has re-read this consumer's pending entries, or those would be handed over twice.
        self._next_reclaim = time.monotonic() + cfg.redis.claim_idle_ms / 2000

    def poll(self, block_ms: int | None = None) -> None:
        """Read one batch of deliveries into the assembler; acknowledge what is dropped."""
        block = self.cfg.redis.block_ms if block_ms is None else block_ms
        deliveries = self.consumer.read(count=self.cfg.redis.read_count, block_ms=block)
        if time.monotonic() >= self._next_reclaim:  # entries pending again after a Redis crash undid their XACK
            self._next_reclaim = time.monotonic() + self.cfg.redis.claim_idle_ms / 2000
            deliveries += self.consumer.reclaim_forgotten(self.assembler.held_entry_ids | set(self.unacked))
        unacked = set(self.unacked)  # a trained group's entries wait for the checkpoint that holds their update
        late = [entry_id for entry_id in self.assembler.add(deliveries) if entry_id not in unacked]
        self._ack_dropped(late + self.assembler.expire())

    def _ack_dropped(self, entry_ids: list[str]) -> None:
        """Count the groups dropped since the last call in the admission hash, then acknowledge."""
        dropped = self.assembler.groups_dropped
        self.admission.dropped(dropped - self._drops_reported)
        self._drops_reported = dropped
        self.consumer.ack(entry_ids)

    def step(self) -> StepResult | None:
        """One optimizer step if `tasks_per_step` groups are ready, else None."""
        self._ack_dropped(self.assembler.drop_stale(self.version))
        if self.assembler.ready_groups < self.cfg.learner.tasks_per_step:
            self._count_lost_groups()
            return None
        waited = time.monotonic() - self._idle_since
        groups = self.assembler.pop_ready(self.cfg.learner.tasks_per_step)
        samples, metrics = self._samples(groups)
        self.ranks.send(Order("train", samples=samples))
        stats = self.trainer.train_step(samples)
        self.learner_step += 1
        self.version += 1
        self.unacked += [entry for group in groups for entry in group.entry_ids]
        self._publish()
        # Consumed once their update is published, as AReaL frees capacity with each new version: a
        # group admitted now is played with this version or a later one, not the one being replaced.
        self.groups_trained += len(groups)
        self.admission.trained(self.groups_trained, self.version)
        self._trace(groups)
        if self.learner_step % self.cfg.learner.checkpoint_every == 0:
            self.checkpoint()
        self._idle_since = time.monotonic()
        counters = self.assembler.counters
        metrics.update(
            policy_version=self.version,
            learner_step=self.learner_step,
            loss=stats.loss,
            pg_loss=stats.pg_loss,
            kl=stats.kl,
            entropy=stats.entropy,
            clip_fraction=stats.clip_fraction,
            approx_kl=stats.approx_kl,
            optimizer_steps=stats.optimizer_steps,
            behav_masked_fraction=stats.behav_masked_fraction,
            behav_weight=stats.behav_weight,
            behav_abs_log_diff=stats.behav_abs_log_diff,
            grad_norm=stats.grad_norm,
            lr=stats.lr,
            tokens=stats.tokens,
            response_tokens=stats.response_tokens,
            tokens_per_s=stats.tokens / stats.seconds,
            step_seconds=stats.seconds,
            wait_seconds=waited,  # since the previous step ended, until this one's groups were ready: the learner's idle time
            groups_trained=len(groups),
            groups_dropped_incomplete=counters.groups_dropped["timeout"],
            groups_dropped_abandoned=counters.groups_dropped["abandoned"],
            groups_dropped_stale=counters.groups_dropped["stale"],
            groups_dropped_lost=counters.groups_dropped["lost"],
            duplicate_steps=counters.duplicates,
            open_groups=self.assembler.open_groups,
        )
        if self.cfg.learner.edge_distill_coef > 0:  # EDGE distillation (learner/edge.py)
            metrics.update(edge_kl=stats.edge_kl, edge_token_fraction=stats.edge_token_fraction)
        export_step_metrics(metrics)
        return StepResult(metrics=metrics, group_ids=[group.group_id for group in groups])

    def _count_lost_groups(self) -> None:
        """After `group_timeout_s` without a group ready (and again every such interval), count the
        admission slots no group holds any more as groups dropped for reason `lost` (learner/admission_report.py)."""
        now = time.monotonic()
        timeout = self.cfg.learner.group_timeout_s
        if now - max(self._idle_since, self._lost_checked) < timeout:
            return
        self._lost_checked = now
        lost = self.admission.lost_groups(self.assembler.held_group_ids, self.cfg.stream_key(), GROUP)
        if lost:
            log.warning("%d admitted group(s) are neither in flight nor in the stream: counted as dropped (lost)", lost)
            self.assembler.counters.groups_dropped["lost"] += lost
            self._ack_dropped([])

    def _publish(self) -> None:
        """Publish the current weights as `self.version` (every rank calls it: ZeRO-3 gathers collectively)."""
        if self.ranks.leader:
            self.publisher.publish(self.version, self.trainer.full_state_dict())
        elif self.cfg.learner.zero_stage == 3:
            self.trainer.full_state_dict()  # this rank's share of rank 0's gather; the copy is dropped

    def _trace(self, groups: list[ReadyGroup], restored: bool = False) -> None:
        """Append which groups this step trained on, right after publishing and before the checkpoint.

        An audit trail across crashes (tests/helpers.py audit_the_stream): a line whose learner_step is not
        above the previous line's marks a restart from a checkpoint, which rolls back the later lines.
        A `restored` line trains nothing: a learner on a new Ray cluster announced its checkpoint's
        weights (at learner_step) under the next version number (learner/weights.py resume_version).
        """
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "learner_step": self.learner_step,
            "policy_version": self.version,
            "at": time.time(),
            "group_ids": [group.group_id for group in groups],
        }
        if restored:
            line["restored"] = True
        with self.trace_path.open("a") as trace:
            trace.write(json.dumps(line) + "\n")

    def _samples(self, groups: list[ReadyGroup]) -> tuple[list[TrainSample], dict]:
        records = [record for group in groups for record in group.records]
        cfg = self.cfg.learner
        parts = advantage_parts(
            [record.group_id for record in records],
            [record.episode_id for record in records],
            [record.step for record in records],
            anchor_keys(records, cfg.anchor),
            [record.reward for record in records],
            [not record.action_valid for record in records],
            gamma=cfg.gamma,
            mode=cfg.advantage_mode,
            episode_stats=cfg.episode_stats,
            invalid_penalty=cfg.invalid_penalty,
        )
        advantages = parts.episode + cfg.omega * parts.step
        # EDGE: the B-half steps of groups where experiences helped carry their teacher prompt (else empty).
        edge = None
        teachers = [np.zeros(0, dtype=np.int32)] * len(records)
        if cfg.edge_distill_coef > 0:
            edge = select_teachers([group.records for group in groups], cfg.edge_gain_threshold, cfg.edge_gain_metric)
            teachers = edge.teacher_prompts
        samples = [
            TrainSample(
                record.prompt_ids,
                record.response_ids,
                record.response_logprobs,
                float(advantage),
                record.policy_version,
                teacher,
            )
            for record, advantage, teacher in zip(records, advantages, teachers)
            if len(record.response_ids)  # a step without generated tokens has nothing to train
        ]
        staleness = Counter(self.version - record.policy_version for record in records)
        # Each anchor group of size s contributes s rows; count groups, not rows.
        sizes = Counter(int(size) for size in parts.anchor_group_size)
        metrics = {
            "advantage_mean": float(advantages.mean()),
            "advantage_std": float(advantages.std()),
            "episode_advantage_abs_mean": float(np.abs(parts.episode).mean()),
            "step_advantage_abs_mean": float(cfg.omega * np.abs(parts.step).mean()),
            "steps_trained": len(samples),
            "anchor_group_sizes": {size: count // size for size, count in sorted(sizes.items())},
            "staleness_histogram": dict(sorted(staleness.items())),
        }
        metrics.update(_episode_outcomes(records))
        if edge is not None:
            metrics.update(edge_metrics(edge, len(groups)))
        return samples, metrics

    def checkpoint(self) -> None:
        """Save, then acknowledge every entry whose update the checkpoint holds."""
        state = LearnerState(
            version=self.version,
            learner_step=self.learner_step,
            groups_trained=self.groups_trained,
            applied_entry_ids=self.unacked,
        )
        self.ranks.send(Order("checkpoint", state=state))
        save_checkpoint(self.trainer, self.tokenizer, self.checkpoint_root, state)
        self.consumer.ack(self.unacked)
        self.unacked = []

    def run(self, on_metrics: Callable[[dict], None] | None = None) -> None:
        """Train until `learner.max_steps` or SIGTERM/SIGINT, then checkpoint (graceful shutdown).

        Ranks > 0 follow rank 0 instead, and return when it stops (their own signals are ignored:
        rank 0, signalled too under torchrun, decides)."""
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.stop_requested.set())
        if not self.ranks.leader:
            self._follow()
            return
        log_path = self.checkpoint_root.parent / "metrics.jsonl"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log_path.open("a") as log:
                while self.learner_step < self.cfg.learner.max_steps and not self.stop_requested.is_set():
                    self.poll()
                    result = self.step()
                    if result is None:
                        self.ranks.send(Order("idle"))
                    else:
                        log.write(json.dumps(result.metrics) + "\n")
                        log.flush()
                        if on_metrics is not None:
                            on_metrics(result.metrics)
        finally:
            self.close()

    def _follow(self) -> None:
        """Ranks > 0: run rank 0's orders, the same collectives in the same order, until it says stop."""
        while True:
            order = self.ranks.receive()
            if order.kind == "train":
                self.trainer.train_step(order.samples)
                self.learner_step += 1  # the same counters as rank 0, which started from the same ones
                self.version += 1
                self._publish()
            elif order.kind == "checkpoint":
                save_checkpoint(self.trainer, self.tokenizer, self.checkpoint_root, order.state)
            elif order.kind == "stop":
                return

    def close(self) -> None:
        """Checkpoint what is not yet checkpointed, release the other ranks, wait for the last publish."""
        try:
            if self.unacked:
                self.checkpoint()
        finally:
            self.ranks.send(Order("stop"))
        self.publisher.flush()


def _episode_outcomes(records) -> dict:
    """Per task type: episodes trained on and how many succeeded ("episodes/<type>/episodes",
    "episodes/<type>/successes"), and their mean length ("episode_length_mean")."""
    outcomes: dict[str, float] = {}
    lengths = []
    for record in records:
        if record.done:
            prefix = f"episodes/{record.task_type}"
            outcomes[f"{prefix}/episodes"] = outcomes.get(f"{prefix}/episodes", 0) + 1
            outcomes[f"{prefix}/successes"] = outcomes.get(f"{prefix}/successes", 0) + int(record.success)
            lengths.append(record.step + 1)
    outcomes["episode_length_mean"] = float(np.mean(lengths)) if lengths else 0.0
    return outcomes


def anchor_keys(records, anchor: str) -> list[str]:
    """The anchor state of each row: its exact observation, or with `learner.anchor: cluster` the
    library cluster the actor retrieved for it (rows without one, e.g. before the library's
    warm-up, fall back to their exact observation; the prefixes keep the two kinds apart)."""
    if anchor == "cluster":
        return [f"cluster:{r.anchor_cluster}" if r.anchor_cluster else f"obs:{r.anchor_obs}" for r in records]
    return [f"obs:{r.anchor_obs}" for r in records]
