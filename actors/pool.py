"""The actor pool on Ray: workers as restartable async Ray actors, scaled while a run goes.

Each worker is a Ray actor (`max_restarts=-1`) holding one ActorWorker. If its process dies,
Ray restarts it; the new incarnation's constructor marks the previous one's episodes in flight
as abandoned, and the pool's next `supervise()` starts its run loop again, so the pool refills.
"""

from __future__ import annotations

import asyncio
import logging

import ray

from slea.config import SleaConfig

log = logging.getLogger(__name__)


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
            dtype=cfg.model.dtype,
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

    async def ensure_running(self) -> bool:
        """Start the run loop if it is not running; True if it was started now."""
        if self._run is None or self._run.done():
            if self._run is not None and self._run.exception() is not None:
                log.error("actor worker loop failed: %r", self._run.exception())
            self._run = asyncio.get_running_loop().create_task(self.worker.run())
            return True
        return False

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
    """Driver-side handle on the workers: start, scale, supervise, stop."""

    def __init__(self, config: SleaConfig, redis_url: str):
        self.config = config
        self.redis_url = redis_url
        self.workers: dict[int, ray.actor.ActorHandle] = {}
        self._next_index = 0
        self._last_summaries: dict[int, dict] = {}  # worker index -> its latest summary

    def _options(self) -> dict:
        actors = self.config.actors
        options = {"num_cpus": actors.num_cpus, "num_gpus": actors.num_gpus}
        if actors.resources:
            options["resources"] = dict(actors.resources)
        return options

    def scale(self, num_workers: int) -> None:
        """Add or remove workers to reach `num_workers` (removed ones mark their episodes abandoned)."""
        while len(self.workers) < num_workers:
            index = self._next_index
            self._next_index += 1
            self.workers[index] = ActorWorkerProcess.options(**self._options()).remote(
                self.config.model_dump(mode="json"), index, self.redis_url
            )
        surplus = sorted(self.workers)[num_workers:]
        if surplus:
            ray.get([self.workers[index].stop.remote() for index in surplus])
            for index in surplus:
                ray.kill(self.workers.pop(index), no_restart=True)
                self._last_summaries.pop(index, None)
        self.supervise()

    def supervise(self) -> int:
        """(Re)start the run loop of every worker that is not running; returns how many were started."""
        started = 0
        for index, worker in list(self.workers.items()):
            try:
                started += ray.get(worker.ensure_running.remote())
            except ray.exceptions.RayActorError as exc:  # restarting right now: next supervise() catches it
                log.warning("actor worker %d unavailable: %s", index, exc)
        return started

    def summaries(self) -> list[dict]:
        """Each worker's summary; a worker that is restarting (killed for memory, crashed) shows
        its last known one instead of failing the caller, the driver's display loop."""
        for index, worker in self.workers.items():
            try:
                self._last_summaries[index] = ray.get(worker.summary.remote())
            except ray.exceptions.RayActorError as exc:
                log.warning("actor worker %d unavailable, showing its last summary: %s", index, exc)
        return [self._last_summaries[index] for index in self.workers if index in self._last_summaries]

    def stop(self) -> list[dict]:
        """Stop every worker (it abandons its groups in flight) and kill it. A worker that is
        restarting cannot stop cleanly: it is killed, and the learner drops its unfinished
        groups when they time out."""
        summaries = []
        stopping = {index: worker.stop.remote() for index, worker in self.workers.items()}  # all at once
        for index, stopped in stopping.items():
            try:
                summaries.append(ray.get(stopped))
            except ray.exceptions.RayActorError as exc:
                log.warning("actor worker %d could not stop cleanly: %s", index, exc)
            ray.kill(self.workers[index], no_restart=True)
        self.workers.clear()
        return summaries
