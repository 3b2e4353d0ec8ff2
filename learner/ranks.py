"""Several learner ranks: rank 0 leads, the others do what it orders.

Rank 0 alone reads the stream, assembles groups, computes advantages, publishes weights, writes
the trace and metrics and acknowledges entries. Everything the other ranks must join (a training
step, a weight gather, a checkpoint, the stop) is announced first as an `Order` that rank 0
broadcasts; each follower runs the same collectives in the same order, so no rank waits on a
collective the others never enter. Rank 0 also sends an idle order after every poll that
trained nothing: followers then block at most one poll (`redis.block_ms`), far below the
process-group timeout, and a dead rank 0 surfaces in them as a timeout, not a silent hang.

Orders are pickled Python objects (`broadcast_object_list`) on their own gloo group: objects
travel through CPU memory, which NCCL cannot do without a device round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch.distributed as dist

from learner.batch import TrainSample
from learner.checkpoint import LearnerState


@dataclass
class Order:
    """What every rank does next, decided by rank 0."""

    kind: Literal["idle", "train", "checkpoint", "stop"]
    samples: list[TrainSample] | None = None  # "train": the whole batch (PolicyTrainer shards it by rank)
    state: LearnerState | None = None  # "checkpoint": the counters rank 0 saves (they name the folder)


class RankChannel:
    """Rank 0 -> every other rank, in program order; with one rank, sending costs nothing."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        # Collective: every rank creates the group, in the same order relative to other groups.
        self.group = dist.new_group(backend="gloo") if world_size > 1 else None

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def share(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (the others pass anything, e.g. None)."""
        if self.world_size == 1:
            return value
        box = [value if self.leader else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def send(self, order: Order) -> None:
        """Rank 0: announce what every rank does next."""
        self.share(order)

    def receive(self) -> Order:
        """Ranks > 0: wait for rank 0's next order."""
        return self.share(None)
