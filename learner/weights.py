"""Versioned weight publishing from the learner to the actors.

The learner owns the policy version. After each optimizer step it publishes version v + 1.

Object-store path (the default, and the CPU one): the state dict goes into the Ray object store (`ray.put`, the
copy); a small named, detached Ray actor, the *weight registry*, receives it asynchronously,
re-puts it so that it owns the object, and keeps only the latest (version, ObjectRef).
Publishing returns as soon as the learner's copy is in the store, so the next training step
never waits for the registry or the actors. Because the registry owns its copy, the latest
weights survive a learner crash, and a restarted learner continues the version line after the
registry's latest version (no repeats). The registry goes with its Ray cluster, so each version
is also recorded in Redis (slea.channels.policy_version_key) before it is announced: a learner on
a new cluster continues after the recorded version too (`resume_version`), never re-issuing a
number that records in the stream already carry.

The actors' contract, by name, without importing this module:

    registry = ray.get_actor(weight_registry_name(run_id), namespace=RAY_NAMESPACE)
    latest = ray.get(registry.get_latest.remote(my_version + 1))  # None: nothing newer
    if latest is not None:
        version, ref = latest
        model.load_state_dict(ray.get(ref))  # {parameter name: CPU tensor}

Collective path (`learner.weight_transport: collective`; learner/weight_push.py): the same
publish also hands the weights to a CollectiveWeightSender, which broadcasts them into every
engine that registered itself here as a receiver (one gloo/NCCL group per engine, backend by
device, slea/weight_group.py). The registry then also lists the receivers:

    registry.register_receiver.remote(receiver_id, incarnation, actor_handle, worker_count)

and the actor worker behind `actor_handle` answers `join_weight_group(host, port, world_size,
backend, timeout_s)` and `receive_weights(plan, version)`. The object-store copy is still
published: it announces the version and serves engines that cannot receive (transformers).
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
import redis
import torch

from slea.channels import RAY_NAMESPACE, policy_version_key, weight_registry_name
from slea.redis_conn import with_reconnect


@dataclass(frozen=True)
class VersionStart:
    """Where a starting learner takes up the version line."""

    version: int  # the version its weights carry from now on
    publish: bool  # announce them now: the registry does not hold the newest version's weights


def resume_version(checkpoint: int, registry: int, recorded: int) -> VersionStart:
    """Where a (re)starting learner continues the version line, so that no version number is ever
    given to two different weights and none is skipped.

    checkpoint: version of the weights it loaded (0: the initial model); registry: the weight
    registry's latest version (-1: none, e.g. on a new Ray cluster); recorded: the latest version
    recorded in Redis (-1: none, e.g. a run from before the record existed)."""
    if registry >= max(checkpoint, recorded):
        # Restarted inside a live Ray cluster: the registry serves weights at least as new as the
        # checkpoint (versions published after it died with the crash). Continue right after them;
        # actors keep those weights one more step.
        return VersionStart(registry, publish=False)
    if recorded <= checkpoint:
        # The checkpoint holds the newest weights ever published (a stop, or a first start): announce
        # them under their own version.
        return VersionStart(checkpoint, publish=True)
    # Versions after the checkpoint up to `recorded` died with their Ray cluster, and records in the
    # stream carry their numbers: the checkpoint's weights need a number of their own, the next one.
    return VersionStart(recorded + 1, publish=True)


class VersionRecord:
    """The newest published version, kept in Redis where it outlives the Ray cluster."""

    def __init__(self, client: redis.Redis, run_id: str, reconnect_max_s: float = 30.0):
        self.client = client
        self.key = policy_version_key(run_id)
        self.reconnect_max_s = reconnect_max_s

    def latest(self) -> int:
        """The recorded version, -1 if none was ever recorded."""
        value = with_reconnect(lambda: self.client.get(self.key), max_wait_s=self.reconnect_max_s)
        return -1 if value is None else int(value)

    def record(self, version: int) -> None:
        with_reconnect(
            lambda: self.client.set(self.key, version, keepttl=True),  # the driver refreshes its expiry
            max_wait_s=self.reconnect_max_s,
            what="the policy version record",
        )


@ray.remote(num_cpus=0)
class WeightRegistry:
    """Holds the latest published (version, ObjectRef of a state dict); versions only go up."""

    def __init__(self):
        self.version = -1  # latest published version; -1 before the first publish
        self.ref = None  # ObjectRef of {name: tensor} for `version`
        self._receivers = {}  # receiver id -> (incarnation, actor handle, worker count): collective transport

    def publish(self, version: int, state_dict: dict) -> None:
        """Record `state_dict` as version `version`, in an object this actor owns."""
        if version <= self.version:
            raise ValueError(f"weight version {version} is not newer than the published {self.version}")
        # Owned here (not by the learner), so the weights outlive a learner crash.
        self.version, self.ref = version, ray.put(state_dict)

    def get_latest(self, min_version: int = 0):
        """(version, ObjectRef) of the latest weights, or None if none is at least `min_version`."""
        if self.ref is None or self.version < min_version:
            return None
        return self.version, self.ref

    def latest_version(self) -> int:
        return self.version

    def register_receiver(self, receiver_id: str, incarnation: str, handle, workers: int) -> None:
        """An engine that takes weights by broadcast (idempotent; a new incarnation replaces the old)."""
        known = self._receivers.get(receiver_id)
        if known is None or known[0] != incarnation:
            self._receivers[receiver_id] = (incarnation, handle, workers)

    def drop_receiver(self, receiver_id: str, incarnation: str) -> None:
        """Forget a receiver the learner failed to reach (it registers again on its next poll)."""
        if receiver_id in self._receivers and self._receivers[receiver_id][0] == incarnation:
            del self._receivers[receiver_id]

    def receivers(self) -> dict:
        return dict(self._receivers)


class RayWeightPublisher:
    """The learner's side of the weight channel: the object store, plus the collective push."""

    def __init__(
        self,
        run_id: str,
        transport: str = "object_store",
        timeout_s: float = 120.0,
        record: VersionRecord | None = None,
        device: torch.device | str = "cpu",
    ):
        """`device`: the learner's training device; a collective push from a GPU uses NCCL."""
        self.record = record  # where each version is recorded before it is announced (None: nowhere)
        self.registry = WeightRegistry.options(
            name=weight_registry_name(run_id), namespace=RAY_NAMESPACE, lifetime="detached", get_if_exists=True
        ).remote()
        self._last_publish = None  # the previous publish call, checked (not awaited) on the next one
        self.sender = None
        if transport == "collective":
            from learner.weight_push import CollectiveWeightSender

            self.sender = CollectiveWeightSender(self.registry, timeout_s=timeout_s, device=device)
        elif transport != "object_store":
            raise ValueError(f"weight transport must be 'object_store' or 'collective', not {transport!r}")

    def latest_version(self) -> int:
        """Latest version the registry holds (-1 if none): a restarted learner continues after it."""
        return ray.get(self.registry.latest_version.remote())

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Put the weights in the object store (the only blocking part) and announce `version`."""
        if self._last_publish is not None:
            ready, _ = ray.wait([self._last_publish], timeout=0)
            if ready:
                ray.get(ready[0])  # surfaces a rejected version instead of losing it
        ref = ray.put(state_dict)
        if self.record is not None:
            # Recorded before any actor can see it, so a version some record carries is always recorded:
            # a crash in between costs at most a number nobody saw, never a number given twice.
            self.record.record(version)
        self._last_publish = self.registry.publish.remote(version, ref)
        if self.sender is not None:
            self.sender.submit(version, state_dict)

    def flush(self) -> None:
        """Wait until the last publish is recorded and, collective, pushed (shutdown, tests)."""
        if self._last_publish is not None:
            ray.get(self._last_publish)
        if self.sender is not None:
            self.sender.flush(timeout_s=4 * self.sender.timeout_s)

    def close(self) -> None:
        """Stop the collective push (its groups close; the engines keep their weights)."""
        if self.sender is not None:
            self.sender.close()
