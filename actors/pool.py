"""The actor pool on Ray: workers as restartable async Ray actors, scaled while a run goes.

Each worker is a Ray actor (`max_restarts=-1`) holding one ActorWorker. If its process dies,
Ray restarts it; the new incarnation's constructor marks the previous one's episodes in flight
as abandoned, and the pool's next `supervise()` starts its run loop again, so the pool refills.
"""

from __future__ import annotations

import asyncio
import logging
import time

import ray

from actors.inflight import abandon_inflight
from slea.channels import inflight_pattern
from slea.config import SleaConfig
from slea.gpu_visibility import gpu_options
from slea.redis_conn import connect
from slea.streams import StreamProducer

log = logging.getLogger(__name__)
ASK_TIMEOUT_S = 0.5  # longest a call waits for workers' answers; the rest are picked up by the next call
RETIRE_TIMEOUT_S = 120.0  # a removed worker that has not stopped after this long is killed
# Why a worker's run loop started (ActorWorkerProcess.ensure_running); the last two are restarts.
FIRST_START = "first start"
PROCESS_RESTARTED = "Ray restarted its process after it died"
LOOP_RESTARTED = "its run loop had failed"


@ray.remote(max_restarts=-1, max_task_retries=0)
class ActorWorkerProcess:
    """Ray actor hosting one ActorWorker (engine, envs, retrieval client, weight subscriber)."""

    def __init__(self, config: dict, worker_index: int, redis_url: str):
        from actors.engines import SamplingSettings, make_engine
        from actors.retrieval_client import RetrievalClient
        from actors.weights_client import WeightSubscriber
        from actors.worker import ActorWorker
        from slea.cpu_threads import use_assigned_cpus
        from slea.redis_conn import connect

        use_assigned_cpus(
            phases_alternate=config["actors"]["synchronous"]
        )  # synchronous: it plays while the learner waits

        self.config = SleaConfig.model_validate(config)
        cfg = self.config
        engine = make_engine(
            cfg.actors.engine,
            cfg.model.name,
            SamplingSettings(
                temperature=cfg.model.temperature, top_p=cfg.model.top_p, max_new_tokens=cfg.model.max_new_tokens
            ),
            dtype=cfg.actors.dtype,
            max_batch=cfg.actors.envs_per_worker,
            engine_args=cfg.actors.engine_args,
        )
        retrieval = None
        if cfg.library.enabled and cfg.actors.retrieval_mode != "none":
            retrieval = RetrievalClient(
                k_strategies=cfg.library.k_strategies,
                k_warnings=cfg.library.k_warnings,
                max_tokens=cfg.library.max_tokens,
                timeout_s=cfg.actors.retrieval_timeout_s,
                max_batch=max(cfg.actors.envs_per_worker, 1),
            )
        weights = WeightSubscriber(
            cfg.run.id,
            str(worker_index),
            transport=cfg.learner.weight_transport,
            receiver=ray.get_runtime_context().current_actor,
        )
        self.worker = ActorWorker(cfg, worker_index, connect(cfg.redis, redis_url), engine, retrieval, weights)
        self._run: asyncio.Task | None = None

    async def ensure_running(self) -> str | None:
        """Start the run loop if it is not running; returns why it started now (FIRST_START,
        PROCESS_RESTARTED: Ray restarted this worker after its process died, LOOP_RESTARTED: the
        loop had failed), None if it was running."""
        if self._run is not None and not self._run.done():
            return None
        if self._run is None:
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
            why = PROCESS_RESTARTED if reconstructed else FIRST_START
        else:
            why = LOOP_RESTARTED
            if self._run.exception() is not None:
                log.error("actor worker loop failed: %r", self._run.exception())
        self._run = asyncio.get_running_loop().create_task(self.worker.run())
        return why

    async def stop(self) -> dict:
        """Start no new groups, abandon the ones in flight, release the engine (vLLM's processes
        end with it rather than outlive the actor when the pool kills it), return the summary."""
        self.worker.stop()
        if self._run is not None:
            await self._run
        self.worker.engine.close()
        return self.worker.summary()

    def summary(self) -> dict:
        return self.worker.summary()

    # The collective weight transport: the learner calls these (learner/weight_push.py).

    async def join_weight_group(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> dict:
        return await self.worker.engine.join_weight_group(host, port, world_size, backend, timeout_s)

    async def receive_weights(self, plan: list[dict], version: int) -> None:
        await self.worker.engine.receive_weights(plan, version)

    async def leave_weight_group(self) -> None:
        await self.worker.engine.leave_weight_group()

    def pid(self) -> int:
        import os

        return os.getpid()


class ActorPool:
    """Driver-side handle on the workers: start, scale, supervise, stop.

    Nothing here waits on a worker that is not ready: on a cluster a new worker waits for the
    autoscaler to add a node, and the driver's display loop must go on meanwhile. A question to a
    worker (start your loop, your summary) stays outstanding until it is answered, and a later
    call picks the answer up; a removed worker stops in the background (`reap()`). A worker that
    has to be killed instead (never started, or not stopping) gets its episodes in flight marked
    abandoned by the pool, as a restarted worker's successor would."""

    def __init__(self, config: SleaConfig, redis_url: str):
        self.config = config
        self.redis_url = redis_url
        self.workers: dict[int, ray.actor.ActorHandle] = {}
        self._next_index = 0
        self._last_summaries: dict[int, dict] = {}  # worker index -> its latest summary
        self._asking: dict[tuple[int, str], ray.ObjectRef] = {}  # (worker index, method) -> call not answered yet
        self._answering: set[int] = set()  # workers whose latest call was answered: placed, up, not restarting
        self._retiring: dict[int, tuple[ray.actor.ActorHandle, ray.ObjectRef, float]] = {}  # handle, stop(), deadline
        self._producer = None  # StreamProducer for the abandon markers of killed workers, made when first needed
        # (worker index, why) of the loops restarted since supervise() last returned
        self._restarts: list[tuple[int, str]] = []
        self._abandon_earlier_workers()

    def _abandon_earlier_workers(self) -> None:
        """Mark abandoned what every earlier worker of this run left listed in flight. A resumed run
        numbers its workers from 0 again, so a worker of the earlier driver with a higher index (the
        pool numbers new workers on after a scale-down) has no successor to do it; until marked, its
        groups would count against the pool's staleness admission (actors/staleness_admission.py) for ever."""
        producer = self._stream_producer()
        for key in producer.client.scan_iter(match=inflight_pattern(self.config.run.id)):
            index = int(key.decode().rsplit(":", 1)[1])
            abandon_inflight(producer.client, producer, self.config.run.id, index)

    def _stream_producer(self) -> StreamProducer:
        """The pool's own producer, for abandon markers (made when first needed)."""
        if self._producer is None:
            self._producer = StreamProducer(
                connect(self.config.redis, self.redis_url),
                self.config.stream_key(),
                reconnect_max_s=self.config.redis.reconnect_max_s,
            )
        return self._producer

    def _options(self) -> dict:
        actors = self.config.actors
        options = {"num_cpus": actors.num_cpus, **gpu_options(actors.num_gpus)}  # none asked: none seen
        if actors.resources:
            options["resources"] = dict(actors.resources)
        return options

    @property
    def alive(self) -> int:
        """Workers in the pool that are placed, up and answering (not waiting for a node, not restarting)."""
        return len(self._answering & set(self.workers))

    def scale(self, num_workers: int) -> None:
        """Add or remove workers to reach `num_workers`, waiting for neither. Workers that have never
        answered (still waiting for resources or loading) go first and are killed; a worker that is up
        stops in the background: it starts no new group and marks its episodes in flight abandoned."""
        self._ask("ensure_running", 0, issue=False)  # fresh news of who is up
        while len(self.workers) < num_workers:
            index = self._next_index
            self._next_index += 1
            self.workers[index] = ActorWorkerProcess.options(**self._options()).remote(
                self.config.model_dump(mode="json"), index, self.redis_url
            )
        removal_order = sorted(self.workers, key=lambda index: (index in self._answering, -index))
        for index in removal_order[: max(len(self.workers) - num_workers, 0)]:
            worker = self.workers.pop(index)
            if index in self._answering:
                self._retiring[index] = (worker, worker.stop.remote(), time.monotonic() + RETIRE_TIMEOUT_S)
            else:
                self._kill(index, worker)
            self._forget(index)
        self.supervise()

    def _forget(self, index: int) -> None:
        for key in [key for key in self._asking if key[0] == index]:
            del self._asking[key]
        self._last_summaries.pop(index, None)
        self._answering.discard(index)

    def _kill(self, index: int, worker: ray.actor.ActorHandle) -> None:
        """Kill a worker that did not stop by itself and mark what it had in flight abandoned."""
        ray.kill(worker, no_restart=True)
        producer = self._stream_producer()
        abandon_inflight(producer.client, producer, self.config.run.id, index)

    def _ask(self, method: str, timeout_s: float, issue: bool = True) -> list[tuple[int, object]]:
        """(worker index, answer) pairs: first the answers to earlier questions that have come in, then
        (unless `issue` is False) those to a fresh question to every worker not asked already, as far
        as they arrive within `timeout_s`. A worker that failed (dying, restarting) is asked next time."""
        answers = self._collect(method, 0)
        if issue:
            for index, worker in self.workers.items():
                if (index, method) not in self._asking:
                    self._asking[index, method] = getattr(worker, method).remote()
            answers += self._collect(method, timeout_s)
        return answers

    def _collect(self, method: str, timeout_s: float) -> list[tuple[int, object]]:
        waiting = {self._asking[index, method]: index for index in self.workers if (index, method) in self._asking}
        if not waiting:
            return []
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=timeout_s)
        answers = []
        for ref in ready:
            index = waiting[ref]
            del self._asking[index, method]
            try:
                answer = ray.get(ref)
                answers.append((index, answer))
                self._answering.add(index)
                if method == "ensure_running" and answer not in (None, FIRST_START):
                    self._restarts.append((index, answer))  # whichever call picked it up, supervise() reports it
            except ray.exceptions.RayActorError as exc:  # restarting right now: asked again next time
                self._answering.discard(index)
                log.warning("actor worker %d unavailable: %s", index, exc)
        return answers

    def supervise(self) -> list[tuple[int, str]]:
        """(Re)start the run loop of every worker that is not running, finish stopping removed ones;
        returns the restarts seen since the last call, (worker index, why), for the driver to count
        and say (a first start is not one)."""
        self._ask("ensure_running", ASK_TIMEOUT_S)
        self.reap()
        restarts, self._restarts = self._restarts, []
        return restarts

    def reap(self) -> int:
        """Kill the removed workers that have stopped (or overran RETIRE_TIMEOUT_S); returns how many are left."""
        for index, (worker, stopping, deadline) in list(self._retiring.items()):
            ready, _ = ray.wait([stopping], timeout=0)
            if not ready and time.monotonic() < deadline:
                continue
            del self._retiring[index]
            if not ready:
                log.warning("actor worker %d did not stop within %.0f s: killed", index, RETIRE_TIMEOUT_S)
                self._kill(index, worker)
                continue
            try:
                ray.get(stopping)
            except ray.exceptions.RayActorError as exc:
                log.warning("actor worker %d could not stop cleanly: %s", index, exc)
                self._kill(index, worker)
                continue
            ray.kill(worker, no_restart=True)
        return len(self._retiring)

    def summaries(self) -> list[dict]:
        """Each worker's summary; a worker that is restarting (killed for memory, crashed) or slow to
        answer shows its last known one instead of holding up the caller, the driver's display loop."""
        self._last_summaries.update(self._ask("summary", ASK_TIMEOUT_S))  # later answers overwrite earlier ones
        return [self._last_summaries[index] for index in self.workers if index in self._last_summaries]

    def stop(self) -> list[dict]:
        """Stop every worker, removed ones still stopping included (each abandons its groups in flight),
        and kill it. A worker that is not up (waiting for resources, restarting) cannot stop by itself:
        it is killed and the pool marks its episodes in flight abandoned."""
        self._ask("ensure_running", 0, issue=False)
        up = {index: worker for index, worker in self.workers.items() if index in self._answering}
        stopping = {index: (worker, worker.stop.remote()) for index, worker in up.items()}  # all at once
        stopping.update({index: (worker, ref) for index, (worker, ref, _deadline) in self._retiring.items()})
        summaries = []
        for index, (worker, stopped) in stopping.items():
            try:
                summaries.append(ray.get(stopped, timeout=RETIRE_TIMEOUT_S))
                ray.kill(worker, no_restart=True)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                log.warning("actor worker %d could not stop cleanly: %s", index, exc)
                self._kill(index, worker)
        for index, worker in self.workers.items():
            if index not in up:
                self._kill(index, worker)
        for index in list(self.workers):
            self._forget(index)
        self.workers.clear()
        self._retiring.clear()
        return summaries
