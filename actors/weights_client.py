"""The actors' side of the weight channel: poll the learner's registry, stage new versions.

The registry is a named Ray actor (slea.channels.weight_registry_name) holding the latest
(version, ObjectRef of a state dict). The engine swaps staged weights in between generations.

With the collective transport (`learner.weight_transport: collective`) and an engine that can
receive a broadcast (vLLM: `join_weight_group`), the subscriber instead registers this actor
worker with the registry as a receiver, and the learner pushes every version into the engine
itself (learner/weight_push.py); polling then only follows the learner's version. Other engines
(transformers) keep staging from the object store.

An engine refuses weights whose names do not match its model (actors.engines.base.check_weight_names):
that version is logged as an error and skipped, the engine keeps generating with (and tagging
steps by) the weights it has, and the growing version lag shows on the dashboards and alerts.
"""

from __future__ import annotations

import logging
import os
import uuid

import ray

from actors.engines.base import GenerationEngine
from monitoring.metrics import metric
from slea.channels import RAY_NAMESPACE, weight_registry_name

log = logging.getLogger(__name__)


class WeightSubscriber:
    def __init__(
        self,
        run_id: str,
        worker_label: str = "0",
        poll_interval_s: float = 0.5,
        transport: str = "object_store",
        receiver=None,
    ):
        self.run_id = run_id
        self.transport = transport
        self.receiver = receiver  # Ray handle of the actor worker the learner pushes to (collective)
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # a restarted process is a new receiver
        self.worker_label = worker_label
        self.poll_interval_s = poll_interval_s
        self.learner_version = 0  # latest version the learner has published (0: the initial weights)
        self._registry = None
        self._staged_version = 0  # newest version handed to the engine (it applies it before its next generation)
        self._refused_version = -1  # newest version the engine refused (not fetched again)

    def _find_registry(self):
        if self._registry is None:
            try:
                self._registry = ray.get_actor(weight_registry_name(self.run_id), namespace=RAY_NAMESPACE)
            except ValueError:  # the learner has not published yet
                return None
        return self._registry

    def current_version(self, engine: GenerationEngine) -> int:
        """The version the engine's next generation uses (staged weights are applied before it)."""
        return max(engine.policy_version, self._staged_version)

    def receives_broadcast(self, engine: GenerationEngine) -> bool:
        return self.transport == "collective" and self.receiver is not None and hasattr(engine, "join_weight_group")

    async def poll(self, engine: GenerationEngine) -> bool:
        """Stage the newest published weights if they are newer than the engine's; True if staged."""
        registry = self._find_registry()
        if registry is None:
            return False
        try:
            self.learner_version = max(self.learner_version, await registry.latest_version.remote())
            if self.receives_broadcast(engine):  # idempotent: registers again after the learner dropped it
                await registry.register_receiver.remote(
                    self.worker_label, self.incarnation, self.receiver, engine.weight_group_size
                )
                return False
            latest = await registry.get_latest.remote(self.current_version(engine) + 1)
        except ray.exceptions.RayActorError:  # registry restarting: find it again next time
            self._registry = None
            return False
        if latest is None:
            return False
        version, ref = latest
        if version == self._refused_version:
            return False  # wait for a newer version rather than fetch this one again
        state_dict = await ref
        try:
            engine.update_weights(state_dict, version)
        except ValueError as exc:  # names do not match the engine's model: nothing was loaded
            self._refused_version = version
            log.error(
                "weights of version %d refused, still generating with version %d: %s",
                version,
                engine.policy_version,
                exc,
            )
            return False
        self._staged_version = version
        metric("actor_weight_updates_total").labels(worker=self.worker_label).inc()
        return True
