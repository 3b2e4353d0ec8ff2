"""The admission hash: the task-group counts by which actor workers admit new groups
(actors/staleness_admission.py) and which the learner keeps up to date (learner/learner.py). Both sides meet
in this Redis hash, never in each other's code."""

from __future__ import annotations

from dataclasses import dataclass

import redis

ADMITTED = "admitted"  # groups the actor workers started (HINCRBY 1, in one transaction with their in-flight listing)
DROPPED = "dropped"  # groups the learner dropped: abandoned, timed out or stale (HINCRBY)
TRAINED = "trained"  # groups the learner's state has trained (HSET: a restart from a checkpoint rolls it back)
VERSION = "version"  # the policy version the learner had published when it wrote TRAINED (HSET with it)


def admission_key(run_id: str) -> str:
    """Redis hash of a run's admission counts (fields ADMITTED, DROPPED, TRAINED, VERSION)."""
    return f"slea:{run_id}:admission"


@dataclass(frozen=True)
class AdmissionCounts:
    """A run's admission hash, pool-wide."""

    admitted: int  # groups the workers started
    trained: int  # groups the learner has trained
    dropped: int  # groups the learner dropped (abandoned, timed out, stale)
    version: int = 0  # the learner's published policy version as of `trained`

    @property
    def outstanding(self) -> int:
        """Groups started and not yet consumed: in play, or played and waiting for the learner."""
        return self.admitted - self.trained - self.dropped

    @classmethod
    def from_hash(cls, fields: dict) -> AdmissionCounts:
        """From HGETALL's reply (bytes keys); a missing field is 0 (a new run has no hash yet)."""

        def count(name: str) -> int:
            return int(fields.get(name.encode(), 0))

        return cls(admitted=count(ADMITTED), trained=count(TRAINED), dropped=count(DROPPED), version=count(VERSION))


def read_counts(client: redis.Redis, run_id: str) -> AdmissionCounts:
    return AdmissionCounts.from_hash(client.hgetall(admission_key(run_id)))
