"""Versioned weight publishing from the learner to the actors.

The learner owns the policy version. After each optimizer step it publishes version v + 1.

CPU path (implemented here): the state dict goes into the Ray object store (`ray.put`, the
copy); a small named, detached Ray actor, the *weight registry*, receives it asynchronously,
re-puts it so that it owns the object, and keeps only the latest (version, ObjectRef).
Publishing returns as soon as the learner's copy is in the store, so the next training step
never waits for the registry or the actors. Because the registry owns its copy, the latest
weights survive a learner crash, and a restarted learner continues the version line after the
registry's latest version (no repeats).

The actors' contract, by name, without importing this module:

    registry = ray.get_actor(weight_registry_name(run_id), namespace=RAY_NAMESPACE)
    latest = ray.get(registry.get_latest.remote(my_version + 1))  # None: nothing newer
    if latest is not None:
        version, ref = latest
        model.load_state_dict(ray.get(ref))  # {parameter name: CPU tensor}

GPU path (not implemented in this module; same `publish(version, ...)` interface): as in
OpenRLHF's `vllm_engine.py`, the learner rank 0 and every vLLM worker join one NCCL group
(`init_process_group` with the learner as rank 0); per parameter the learner calls the
engines' `update_weight(name, dtype, shape)` remotely and broadcasts the tensor on the group,
then bumps the registry's version with no ObjectRef; actors switch between generations.
"""

from __future__ import annotations

import ray
import torch

from slea.channels import RAY_NAMESPACE, weight_registry_name



@ray.remote(num_cpus=0)
class WeightRegistry:
    """Holds the latest published (version, ObjectRef of a state dict); versions only go up."""

    def __init__(self):
        self.version = -1  # latest published version; -1 before the first publish
        self.ref = None  # ObjectRef of {name: tensor} for `version`

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


class RayWeightPublisher:
    """The learner's side of the CPU weight channel."""

    def __init__(self, run_id: str):
        self.registry = WeightRegistry.options(
            name=weight_registry_name(run_id), namespace=RAY_NAMESPACE, lifetime="detached", get_if_exists=True
        ).remote()
        self._last_publish = None  # the previous publish call, checked (not awaited) on the next one

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
        self._last_publish = self.registry.publish.remote(version, ref)

    def flush(self) -> None:
        """Wait until the last publish is recorded (shutdown, tests)."""
        if self._last_publish is not None:
            ray.get(self._last_publish)
