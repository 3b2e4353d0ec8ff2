"""The learner as Ray actors, so `slea train` can place it on its own (GPU) worker group.

`start_learner` starts `learner.num_ranks` LearnerProcess actors that form one DeepSpeed
process group. Building a rank joins that group, which blocks until every rank has joined, so
construction takes two calls: rank 0 hosts the rendezvous store on its own node's address, then
every rank joins at once. The driver talks to rank 0 only (metrics, version, stop); the other ranks
follow rank 0 and return from run() when it does.
"""

from __future__ import annotations

import os
import threading

import ray

from slea.config import SleaConfig
from slea.weight_group import host_store, join_store

RENDEZVOUS_TIMEOUT_S = 600.0  # a rank's wait for the others at the rendezvous store


@ray.remote(max_concurrency=4)
class LearnerProcess:
    """One learner rank; rank 0 runs the Learner loop on a thread, the driver drains its metrics and can stop it."""

    def __init__(self, config: dict, rank: int = 0, world_size: int = 1):
        from learner.device import hide_unassigned_gpus
        from slea.cpu_threads import use_assigned_cpus

        # Before torch or DeepSpeed look for GPUs: a num_gpus 0 rank on a GPU node still sees them (Ray 2.60).
        hide_unassigned_gpus(config["learner"]["num_gpus"])
        use_assigned_cpus(phases_alternate=config["actors"]["synchronous"])  # synchronous: it trains while actors wait
        self.config, self.rank, self.world_size = config, rank, world_size
        self.learner = None  # built by join()
        self._store = None  # rank 0's rendezvous store, hosted by rendezvous_address()
        self._metrics: list[dict] = []
        self._lock = threading.Lock()
        self.error: str | None = None

    def rendezvous_address(self) -> tuple[str, int]:
        """(this node's IP, port) of the store rank 0 now hosts for the other ranks, listening on
        that address only (127.0.0.1 on a local Ray: driver/local_ray.py)."""
        self._store = host_store(ray.util.get_node_ip_address(), self.world_size, RENDEZVOUS_TIMEOUT_S)
        return self._store.host, self._store.port

    def join(self, master_addr: str | None = None, master_port: int | None = None) -> None:
        """Build this rank's Learner; with several ranks, every rank must be inside join() at once."""
        from learner.engine import init_distributed
        from learner.learner import Learner

        if self.world_size > 1:
            # The variables torchrun would set, which DeepSpeed reads. LOCAL_RANK is 0: Ray shows
            # each actor only its own GPUs (CUDA_VISIBLE_DEVICES).
            os.environ.update(
                RANK=str(self.rank),
                WORLD_SIZE=str(self.world_size),
                LOCAL_RANK="0",
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(master_port),
            )
            store = (
                self._store
                if self.rank == 0
                else join_store(master_addr, master_port, self.world_size, RENDEZVOUS_TIMEOUT_S)
            )
            init_distributed(store)
        self.learner = Learner(SleaConfig.model_validate(self.config))

    def run(self) -> int:
        """Train to learner.max_steps (or stop()); returns the last published version (rank 0)."""
        try:
            self.learner.run(on_metrics=self._collect)
        except Exception as exc:
            self.error = repr(exc)
            raise
        return self.learner.version

    def _collect(self, metrics: dict) -> None:
        with self._lock:
            self._metrics.append(metrics)

    def drain_metrics(self) -> list[dict]:
        with self._lock:
            drained, self._metrics = self._metrics, []
        return drained

    def version(self) -> int:
        return self.learner.version

    def stop(self) -> None:
        """Finish the current step, checkpoint, return from run() (rank 0; it stops the others)."""
        self.learner.stop_requested.set()


def start_learner(config: SleaConfig, **options) -> list:
    """`learner.num_ranks` joined LearnerProcess actors, rank 0 first; `options` go to each actor's
    `.options()` (num_cpus, num_gpus, resources). A start that fails kills every rank it made before
    it raises: the others would sit in the rendezvous holding their CPUs or GPUs, and the driver's
    next start could not be placed."""
    world_size = config.learner.num_ranks
    as_dict = config.model_dump(mode="json")
    ranks = [LearnerProcess.options(**options).remote(as_dict, rank, world_size) for rank in range(world_size)]
    try:
        address = ray.get(ranks[0].rendezvous_address.remote()) if world_size > 1 else (None, None)
        joining = [rank.join.remote(*address) for rank in ranks]
        while joining:
            joined, joining = ray.wait(joining)
            ray.get(joined)  # a rank that fails to build raises now, not when the others' rendezvous times out
    except BaseException:
        for rank in ranks:
            ray.kill(rank, no_restart=True)
        raise
    return ranks
