"""The collective weight transport, learner side: push each new version into the engines.

Engines come and go with the actor pool, so there is one small group per engine (the learner
as rank 0 + that engine's workers), not one group for the whole pool:

1. An actor worker whose engine can receive (vLLM) registers `(receiver id, incarnation, its
   Ray handle, worker count)` with the run's weight registry (learner/weights.py), by name.
2. This sender, on a background thread of learner rank 0, sees a receiver it has no link to,
   hosts a TCPStore on a free port, asks the actor (Ray call) to `join_weight_group` there and
   joins as rank 0 (slea/weight_group.py: gloo on CPU, NCCL on GPU).
3. For every link behind the latest version it calls the actor's `receive_weights(plan,
   version)` (the engine lets running generations finish, holds new ones back, receives,
   loads in place) and broadcasts the buckets of the plan on the link's group.

Versions are still announced through the registry (with the object-store copy, which the
transformers engine and a just-started engine's first poll use), so actors know the learner's
version. Every wait is bounded by `timeout_s`: a receiver that died, stalls or fails is
dropped (its link closed, its registration removed) and may register again; the learner's
training thread never waits on any of this.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import ray
import torch

from slea.weight_group import DEFAULT_BUCKET_BYTES, WeightGroup, backend_for, host_store, plan_buckets, send_weights

log = logging.getLogger(__name__)


@dataclass
class _Link:
    incarnation: str  # which process of the receiver this group reaches (a restarted actor is a new one)
    handle: ray.actor.ActorHandle  # the actor worker hosting the engine
    group: WeightGroup
    dtype: torch.dtype  # the engine's model dtype: buckets are sent in it
    version: int = -1  # latest version the engine has taken over this link


class CollectiveWeightSender:
    """Learner rank 0: keeps every registered engine on the latest submitted version."""

    def __init__(
        self,
        registry,
        *,
        timeout_s: float = 120.0,
        device: torch.device | str = "cpu",
        host: str | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        poll_s: float = 1.0,
        retry_after_s: float | None = None,
    ):
        self.registry = registry
        self.timeout_s = timeout_s
        self.device = torch.device(device)  # the learner's (learner/device.py): NCCL from a GPU, gloo from a CPU
        self.backend = backend_for(self.device)
        self.host = host or ray.util.get_node_ip_address()
        self.bucket_bytes = bucket_bytes
        self.poll_s = poll_s  # how often newly registered engines are looked for without a new version
        self.retry_after_s = timeout_s if retry_after_s is None else retry_after_s
        self.links: dict[str, _Link] = {}
        self.failures = 0  # receivers dropped after a failed join or push
        self._latest: tuple[int, dict] | None = None
        self._failed_at: dict[str, float] = {}  # receiver id -> when it last failed (retried after retry_after_s)
        self._passes = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slea-weight-push", daemon=True)
        self._thread.start()

    def submit(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Push `version` to every engine, in the background (a newer submit replaces an unsent one)."""
        self._latest = (version, state_dict)
        self._wake.set()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until one full pass started after this call is done (tests, shutdown)."""
        with self._cond:
            target = self._passes + 2  # the pass now running may have missed the latest submit
            self._wake.set()
            if not self._cond.wait_for(lambda: self._passes >= target or self._stop.is_set(), timeout_s):
                raise TimeoutError(f"weight push did not finish a pass within {timeout_s} s")

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=self.timeout_s)
        for receiver_id in list(self.links):
            self._disconnect(receiver_id, leave=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.sync()
            except Exception:  # the registry restarting, Ray shutting down: try again next pass
                log.exception("weight push pass failed")
            with self._cond:
                self._passes += 1
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def sync(self) -> None:
        """Connect new receivers, forget vanished ones, push the latest version where it is missing."""
        registered = ray.get(self.registry.receivers.remote(), timeout=self.timeout_s)
        for receiver_id in list(self.links):
            entry = registered.get(receiver_id)
            if entry is None or entry[0] != self.links[receiver_id].incarnation:
                self._disconnect(receiver_id, abort=True)  # unregistered, or restarted as a new process
        latest = self._latest
        if latest is None:
            return
        version, state_dict = latest
        for receiver_id, (incarnation, handle, workers) in registered.items():
            if time.monotonic() - self._failed_at.get(receiver_id, -1e9) < self.retry_after_s:
                continue
            try:
                link = self.links.get(receiver_id)
                if link is None:
                    link = self.links[receiver_id] = self._connect(incarnation, handle, workers)
                if link.version < version:
                    self._push(link, version, state_dict)
            except Exception as error:  # dead, stalled or failing receiver: drop it, never hang
                log.warning("weight receiver %s dropped: %r", receiver_id, error)
                self.failures += 1
                self._failed_at[receiver_id] = time.monotonic()
                self._disconnect(receiver_id, abort=True)
                self.registry.drop_receiver.remote(receiver_id, incarnation)

    def _connect(self, incarnation: str, handle, workers: int) -> _Link:
        world_size = 1 + workers
        store = host_store(self.host, world_size, self.timeout_s)
        joined = handle.join_weight_group.remote(self.host, store.port, world_size, self.backend, self.timeout_s)
        group = WeightGroup(store, 0, world_size, self.backend, self.timeout_s, self.device)  # waits for the workers
        reply = ray.get(joined, timeout=self.timeout_s)
        return _Link(incarnation, handle, group, getattr(torch, reply["dtype"]))

    def _push(self, link: _Link, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        plan = plan_buckets(state_dict, link.dtype, self.bucket_bytes)
        received = link.handle.receive_weights.remote(plan, version)
        send_weights(link.group, state_dict, plan)  # the engine joins once its running generations finish
        ray.get(received, timeout=self.timeout_s)
        link.version = version

    def _disconnect(self, receiver_id: str, leave: bool = False, abort: bool = False) -> None:
        """Forget a link. `leave`: ask the engine to close its end too (a clean stop); `abort`: the
        peer is dead or stalled, so release the group without waiting for ops it will never finish."""
        link = self.links.pop(receiver_id, None)
        if link is None:
            return
        if leave:
            link.handle.leave_weight_group.remote()  # best effort: the actor may be gone
        link.group.close(abort=abort)
