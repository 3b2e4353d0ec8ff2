"""An actor worker: many environments played concurrently by one engine, streamed to Redis.

The worker launches task groups (the same task G times, optionally A/B and budget-mixed with
one budget per group), plays their episodes as asyncio tasks sharing one batched engine and one
batched retrieval client, and XADDs every step as it happens. It does not start a new group while
its weights are more than `max_staleness` versions behind the learner, while the learner's stream
lag is over `redis.max_lag`, or when the learner would train the group more than `max_staleness`
versions later (the pool's staleness admission, actors/staleness_admission.py); it never waits for an update
to finish (except in `actors.synchronous` mode, the no-overlap baseline that `slea bench async`
compares against).

Every episode in flight is listed in a Redis hash, so a worker that is restarted (or removed
from the pool) leaves no half episode that could pass for a complete one: its successor writes
an `abandoned` marker for each, which the learner and library drop.

Steps leave the worker's outbox only once Redis has them (actors/outbox.py): a full Redis holds
them, and the worker's episodes wait once the outbox is full. A background task or group task
that fails ends run() with its exception (never dropped silently); the pool's next supervise()
logs it and starts the loop again, which marks the episodes then in flight abandoned.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field

import msgpack
import redis

from actors.engines.base import GenerationEngine
from actors.envs.base import EnvTask, TextEnv
from actors.envs.registry import make_env
from actors.envs.tasks import TaskSampler, panel_tasks
from actors.episode import EpisodeResult, EpisodeSpec, StepTimers, play_episode
from actors.inflight import abandon_inflight
from actors.outbox import Outbox, StepsLost
from actors.prompts import PromptBuilder
from actors.retrieval_client import RetrievalClient
from actors.staleness_admission import RUN_END, StalenessBound, claim_group
from monitoring.metrics import metric
from slea.channels import inflight_key, sync_claims_key
from slea.config import SleaConfig
from slea.records import StepRecord
from slea.redis_conn import RedisBackpressure, with_reconnect
from slea.stream_admin import group_stats
from slea.streams import StreamProducer

FLUSH_INTERVAL_S = 0.05
GATE_CHECK_S = 1.0
SYNC_CHECK_S = 0.05  # synchronous mode polls for the next version this often: its waits are what it measures


@dataclass
class WorkerStats:
    """Counters a worker reports to the pool and to `slea bench actors`."""

    groups_started: int = 0
    episodes_finished: int = 0
    successes: int = 0
    abandoned_marked: int = 0  # markers written for a previous incarnation's or a stopped run's episodes
    throttled_s: float = 0.0
    # of throttled_s, the waits because the updates left until learner.max_steps have their groups: the
    # pool is done, not too large (the autoscaler does not count them, driver/pool_control.py)
    run_end_s: float = 0.0
    # wall seconds with at least one group in play (generation, env steps, prompts; `slea bench async`)
    busy_s: float = 0.0
    timers: StepTimers = field(default_factory=StepTimers)


# StepTimers fields the engine fills -> (Prometheus counter, its labels besides the worker's)
_ENGINE_COUNTERS = {
    "prefill_s": ("actor_engine_seconds_total", {"phase": "prefill"}),
    "decode_s": ("actor_engine_seconds_total", {"phase": "decode"}),
    "prompt_tokens": ("actor_prompt_tokens_total", {}),
    "cached_prompt_tokens": ("actor_cached_prompt_tokens_total", {}),
}


def training_tasks(env: TextEnv, config: SleaConfig, seed: int) -> TaskSampler:
    """The worker's training tasks: every task an evaluation of this run plays is held out."""
    return TaskSampler(
        env, seed=seed, held_out=panel_tasks(env, config.envs.eval_panel, size=config.held_out_panel_size())
    )


class ActorWorker:
    def __init__(
        self,
        config: SleaConfig,
        worker_index: int,
        client: redis.Redis,
        engine: GenerationEngine,
        retrieval: RetrievalClient | None = None,
        weights=None,
    ):
        self.config = config
        self.worker_index = worker_index
        self.client = client
        self.engine = engine
        self.retrieval = retrieval
        self.weights = weights  # a WeightSubscriber, or None (weights never change)
        self.producer = StreamProducer(
            client,
            config.stream_key(),
            batch_size=config.redis.batch_size,
            reconnect_max_s=config.redis.reconnect_max_s,
        )
        self.builder = PromptBuilder.from_config(engine.tokenizer, config)
        self.stats = WorkerStats()
        self._rng = random.Random(config.run.seed * 1_000_003 + worker_index)
        self._envs: list[TextEnv] = []
        self.outbox = Outbox(
            self.producer,
            max_steps=config.actors.max_outbox_steps,
            window_s=config.redis.reconnect_max_s,
            worker_label=str(worker_index),
        )
        self._failure: BaseException | None = None  # what ended a background or group task, ending run()
        self._inflight_key = inflight_key(config.run.id, worker_index)
        self._stopping = asyncio.Event()
        self._running: set[asyncio.Task] = set()  # one task per group in flight
        self._label = str(worker_index)
        self._sync_full_version = -1  # synchronous mode: newest version whose groups are all claimed
        self._groups_in_play = 0  # groups between their first episode's start and their last episode's end
        self._busy_since = 0.0  # perf_counter when _groups_in_play last went from 0 to 1
        self._exported_engine = dict.fromkeys(_ENGINE_COUNTERS, 0)  # what the counters carry of self.stats.timers
        if config.actors.synchronous and weights is None:
            raise ValueError("actors.synchronous needs a weight subscriber: the worker waits for each new version")
        template_env = self._new_env()
        self._tasks = training_tasks(template_env, config, seed=self._rng.getrandbits(31))
        self._envs.append(template_env)

    # -- environments and tasks -------------------------------------------------------------------

    def _new_env(self) -> TextEnv:
        envs = self.config.envs
        return make_env(envs.name, envs.params, envs.max_steps, envs.plugins)

    def _borrow_env(self) -> TextEnv:
        return self._envs.pop() if self._envs else self._new_env()

    def _group_specs(self, task: EnvTask) -> list[EpisodeSpec]:
        actors, envs = self.config.actors, self.config.envs
        group_id = f"g-{uuid.uuid4().hex[:16]}"
        retrieving = actors.retrieval_mode != "none" and self.config.library.enabled and self.retrieval is not None
        size = actors.group_size
        # Budget-mixed training draws one budget per group: the group's advantages compare its
        # trajectories with each other, which is fair only under the same horizon.
        budget = self._rng.choice(envs.budgets) if envs.budgets else self._envs_max_steps()
        specs = []
        for index in range(size):
            with_experience = retrieving and not (actors.ab_groups and index >= size // 2)
            # The B half retrieves without showing: for the anchor cluster of each step (so a state
            # has one cluster key in both halves) and, under EDGE distillation, for its teacher prompt.
            hidden_retrieval = retrieving and not with_experience
            teacher_prompt = hidden_retrieval and self.config.learner.edge_distill_coef > 0
            specs.append(
                EpisodeSpec(
                    self.config.run.id,
                    task,
                    group_id,
                    f"{group_id}-{index}",
                    budget,
                    with_experience,
                    actors.retrieval_mode,
                    teacher_prompt,
                    hidden_retrieval,
                )
            )
        return specs

    def _envs_max_steps(self) -> int:
        return self.config.envs.max_steps or (self._envs[0].max_steps if self._envs else 50)

    # -- abandoned-episode bookkeeping ------------------------------------------------------------

    def mark_abandoned(self) -> int:
        """Write abandon markers for every episode listed in flight, then clear the list."""
        markers = abandon_inflight(self.client, self.producer, self.config.run.id, self.worker_index)
        self.stats.abandoned_marked += len(markers)
        for marker in markers:
            metric("actor_episodes_total").labels(
                env=marker.env_name, task_type=marker.task_type, outcome="abandoned"
            ).inc()
        return len(markers)

    async def _claim(self, specs: list[EpisodeSpec]) -> bool:
        """List the group's episodes in flight and count it admitted (actors/staleness_admission.py); False
        (after waiting a moment) when the learner would train it more than `max_staleness` versions
        from now. A worker with no learner behind it (no weight subscriber) admits every group."""
        bound = None
        if self.weights is not None:
            # The version the group's first generation will use: weights staged while the worker waited
            # count, though no generation has applied them yet.
            playing = self.weights.current_version(self.engine)
            learner = self.config.learner
            bound = StalenessBound(self.config.actors.max_staleness, learner.tasks_per_step, playing, learner.max_steps)
        listing = {
            spec.episode_id: msgpack.packb(
                {
                    "task_id": spec.task.task_id,
                    "task_type": spec.task.task_type,
                    "env_name": spec.task.env_name,
                    "group_id": spec.group_id,
                    "episode_id": spec.episode_id,
                }
            )
            for spec in specs
        }
        try:
            reason = await asyncio.to_thread(
                self._write,
                lambda: claim_group(self.client, self.config.run.id, self._inflight_key, listing, bound),
            )
        except RedisBackpressure:  # nothing was written and nothing is lost: start the group once Redis has room
            reason = "redis_full"
        if reason is None:
            return True
        await asyncio.sleep(GATE_CHECK_S)
        self.stats.throttled_s += GATE_CHECK_S
        if reason == RUN_END:
            self.stats.run_end_s += GATE_CHECK_S
        metric("actor_throttled_seconds_total").labels(worker=self._label, reason=reason).inc(GATE_CHECK_S)
        return False

    def _write(self, call):
        """A write of the worker's in-flight list: rides out a Redis restart; a full Redis says so."""
        return with_reconnect(
            call, max_wait_s=self.config.redis.reconnect_max_s, what="the actor's in-flight episode list"
        )

    # -- the run loop -----------------------------------------------------------------------------

    async def run(self, max_groups: int | None = None) -> WorkerStats:
        """Play groups until stop() (or `max_groups` groups finished); returns the stats. Starts by
        marking a previous incarnation's half episodes abandoned, before anything new is played. A
        background or group task that fails ends it with that task's exception."""
        self._failure = None
        self.mark_abandoned()
        flusher = self._watched(self._flush_loop())
        syncer = self._watched(self._weights_loop()) if self.weights is not None else None
        capacity = max(self.config.actors.envs_per_worker, self.config.actors.group_size)
        running = self._running
        slots = asyncio.Semaphore(self.config.actors.envs_per_worker)
        waiting: list[EpisodeSpec] | None = None
        try:
            while self._going() and (max_groups is None or self.stats.groups_started < max_groups):
                if len(running) * self.config.actors.group_size + self.config.actors.group_size > capacity:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    running.difference_update([task for task in running if task.done()])
                    continue
                if not await self._gate_open():
                    continue
                # A group the admission turned away is offered again as it is: waiting skips no task.
                specs = waiting or self._group_specs(next(self._tasks))
                waiting = None
                if not await self._claim(specs):
                    waiting = specs
                    continue
                self.stats.groups_started += 1
                running.add(self._watched(self._play_group(specs, slots)))
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            running.clear()  # a loop started again after a failure begins with no group in play
            flusher.cancel()
            if syncer is not None:
                syncer.cancel()
            if not isinstance(self._failure, StepsLost):  # past the window: the restarted loop marks them
                await self.outbox.drain()
                self.mark_abandoned()  # episodes cut short by a stop
            else:
                self.outbox.count_lost("worker_failed")  # steps of episodes cut short after the failure
        if self._failure is not None:
            raise self._failure
        return self.stats

    def _going(self) -> bool:
        return not self._stopping.is_set() and self._failure is None

    def _watched(self, coroutine) -> asyncio.Task:
        """A task whose failure ends run(): its exception is kept and every group in play is cut short."""
        task = asyncio.create_task(coroutine)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None or self._failure is not None:
            return
        self._failure = task.exception()
        for running in self._running:
            running.cancel()

    def stop(self) -> None:
        """Start no new groups and cut the ones in flight short: their episodes are marked abandoned
        (the learner and library drop them), so stopping never waits for a slow generation."""
        self._stopping.set()
        for task in self._running:
            task.cancel()

    async def _play_group(self, specs: list[EpisodeSpec], slots: asyncio.Semaphore) -> None:
        if self._groups_in_play == 0:
            self._busy_since = time.perf_counter()
        self._groups_in_play += 1
        try:
            await asyncio.gather(*(self._play_one(spec, slots) for spec in specs))
        finally:
            self._groups_in_play -= 1
            if self._groups_in_play == 0:
                self.stats.busy_s += time.perf_counter() - self._busy_since

    def busy_seconds(self) -> float:
        """Wall seconds spent with a group in play so far, the one in progress included: the actor's
        side of where a learner step's time goes (`slea bench async`); the rest of its time it waited."""
        running = time.perf_counter() - self._busy_since if self._groups_in_play else 0.0
        return self.stats.busy_s + running

    async def _play_one(self, spec: EpisodeSpec, slots: asyncio.Semaphore) -> EpisodeResult:
        async with slots:
            env = self._borrow_env()
            try:
                result = await play_episode(
                    spec, env, self.engine, self.builder, self.retrieval, self._emit, self.stats.timers
                )
            finally:
                self._envs.append(env)
        await self.outbox.drain()  # the episode's last step is in the stream before it leaves the in-flight list
        self._write(lambda: self.client.hdel(self._inflight_key, spec.episode_id))
        self._count(result)
        self._export_engine_totals()
        return result

    def _count(self, result: EpisodeResult) -> None:
        task = result.spec.task
        self.stats.episodes_finished += 1
        self.stats.successes += result.success
        outcome = "success" if result.success else "failure"
        metric("actor_episodes_total").labels(env=task.env_name, task_type=task.task_type, outcome=outcome).inc()
        metric("actor_episode_steps").labels(env=task.env_name).observe(result.steps)
        metric("actor_env_steps_total").labels(env=task.env_name, task_type=task.task_type).inc(result.steps)
        if result.invalid_steps:
            metric("actor_invalid_actions_total").labels(env=task.env_name).inc(result.invalid_steps)

    def _export_engine_totals(self) -> None:
        """Move the engine's phase seconds and prompt tokens from the timers into the Prometheus
        counters: the timers are shared by the episodes in play, so what is new since the last
        export goes in, whichever episode it came from."""
        for field_name, (name, labels) in _ENGINE_COUNTERS.items():
            now = getattr(self.stats.timers, field_name)
            metric(name).labels(worker=self._label, **labels).inc(now - self._exported_engine[field_name])
            self._exported_engine[field_name] = now

    # -- stream output ----------------------------------------------------------------------------

    async def _emit(self, record: StepRecord) -> None:
        """A step played: into the outbox; while the outbox is full the episode waits for Redis."""
        self.outbox.add(record)
        metric("actor_generated_tokens_total").labels(worker=self._label).inc(len(record.response_ids))
        if self.outbox.full:
            await self.outbox.drain()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            started = time.perf_counter()
            self.outbox.flush()
            self.stats.timers.overhead_s += time.perf_counter() - started

    # -- weights, staleness and backpressure ------------------------------------------------------

    async def _weights_loop(self) -> None:
        while True:
            await self.weights.poll(self.engine)
            metric("actor_policy_version").labels(worker=self._label).set(self.engine.policy_version)
            await asyncio.sleep(self.weights.poll_interval_s)

    async def _gate_open(self) -> bool:
        """False (after waiting a moment) while stale or while the learner lags too far behind."""
        if self.config.actors.synchronous:
            return await self._sync_slot_claimed()
        reason = None
        if self.weights is not None:
            lag = self.weights.learner_version - self.weights.current_version(self.engine)
            metric("actor_version_lag").labels(worker=self._label).set(lag)
            if lag > self.config.actors.max_staleness:
                reason = "stale_weights"
        if reason is None:
            stats = await asyncio.to_thread(group_stats, self.client, self.config.stream_key())
            learner = stats.get("learner")
            if learner is not None and learner.lag > self.config.redis.max_lag:
                reason = "stream_lag"
        if reason is None:
            return True
        await asyncio.sleep(GATE_CHECK_S)
        self.stats.throttled_s += GATE_CHECK_S
        metric("actor_throttled_seconds_total").labels(worker=self._label, reason=reason).inc(GATE_CHECK_S)
        return False

    async def _sync_slot_claimed(self) -> bool:
        """Synchronous mode: start a group only on the learner's newest weights and only as one of the
        first `learner.tasks_per_step` groups of that version (a pool-wide count in Redis); otherwise
        wait for the next version. Actors then idle while the learner trains, and the learner gets
        exactly one full batch per version: the no-overlap baseline of `slea bench async`.

        The 50 ms poll costs the baseline 25 ms per step on average, under 1% of a step (`slea bench
        async` measures the whole hand-off at ~2%). A registry that answers on the publish itself
        would need an async Ray actor, and those give up executing one caller's calls in order,
        which a restarted learner's view of the latest version relies on (learner/weights.py)."""
        await self.weights.poll(self.engine)  # do not wait for the weights loop's next tick
        version = self.weights.learner_version
        if version != self._sync_full_version and self.weights.current_version(self.engine) == version:
            claims_key = sync_claims_key(self.config.run.id)
            claimed = await asyncio.to_thread(self._write, lambda: self.client.hincrby(claims_key, str(version), 1))
            if claimed <= self.config.learner.tasks_per_step:
                return True
            self._sync_full_version = version
        await asyncio.sleep(SYNC_CHECK_S)
        self.stats.throttled_s += SYNC_CHECK_S
        metric("actor_throttled_seconds_total").labels(worker=self._label, reason="synchronous").inc(SYNC_CHECK_S)
        return False

    def summary(self) -> dict:
        timers = self.stats.timers
        return {
            "worker": self.worker_index,
            "engine": self.engine.name,
            "policy_version": self.engine.policy_version,
            "retrieval_misses": self.retrieval.misses if self.retrieval is not None else 0,
            **{k: v for k, v in vars(self.stats).items() if k != "timers"},
            "busy_s": self.busy_seconds(),
            "timers": vars(timers),
        }
