"""A worker's episodes in flight, listed in a Redis hash so that nothing half played can pass for a
whole episode: a restarted worker's successor, or the pool for a worker it killed or one an earlier
driver left, writes an `abandoned` marker for each listed episode, and the learner and the library
drop the marked episodes' groups. (Episodes are listed as their group is admitted, in the same
transaction: actors/staleness_admission.py.)"""

from __future__ import annotations

import msgpack
import redis

from slea.channels import inflight_key
from slea.records import StepRecord
from slea.streams import StreamProducer


def abandon_marker(fields: dict, run_id: str) -> StepRecord:
    """The record that tells consumers an episode will never complete."""
    return StepRecord(
        run_id=run_id,
        task_id=fields["task_id"],
        task_type=fields["task_type"],
        env_name=fields["env_name"],
        group_id=fields["group_id"],
        episode_id=fields["episode_id"],
        step=-1,
        anchor_obs="",
        done=True,
        abandoned=True,
    )


def abandon_inflight(client: redis.Redis, producer: StreamProducer, run_id: str, worker_index: int) -> list[StepRecord]:
    """Mark every episode a worker lists in flight abandoned and clear its list; returns the markers.
    The worker's successor calls it, and so does the pool for a worker it had to kill."""
    key = inflight_key(run_id, worker_index)
    listed = client.hgetall(key)
    markers = [abandon_marker(msgpack.unpackb(raw), run_id) for raw in listed.values()]
    if markers:
        producer.send(markers)
        client.hdel(key, *listed.keys())
    return markers
