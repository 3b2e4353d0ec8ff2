"""Staleness admission: a worker starts a task group only if the learner will train it within
`actors.max_staleness` versions of the policy it is played with.

The learner trains `learner.tasks_per_step` groups a version, in the order they complete. A group
started while `outstanding` groups wait ahead of it (started by any worker, not yet trained into a
published version nor dropped by the learner) is trained about outstanding // tasks_per_step
versions later, so the pool keeps at most (max_staleness + 1) x tasks_per_step groups outstanding.
This is AReaL's staleness manager (areal/infra/staleness_manager.py: capacity = (max_staleness +
version + 1) x batch - (accepted + running), where version x batch counts what was trained), with
the counts pool-wide in Redis because the workers are separate processes, a group the learner drops
freeing its slot as AReaL's rejected rollouts do, and one batch less for each version a worker's
weights lag behind the learner's (AReaL's generation servers update with the trainer; our workers
poll for new weights, so a group started just after a publish may still play the older version).

Without it each worker only checked that its own weights were within `max_staleness` versions of
the learner's, which held while the pool ran ever further ahead: in the learning study's first runs
the trained steps were 4 versions old from update 8 on and the learner dropped 42% of the groups
played as too stale (docs/learning.md).

A run's learner stops after `learner.max_steps` updates of `tasks_per_step` groups, so the pool also
keeps no more groups outstanding than the updates left will train, max_steps x tasks_per_step -
trained: in a short run (configs/local.yaml, 2 updates) the workers otherwise played a third group
during the last update that nothing trains, on the CPUs that update needed. Counted from the trained
total, which a restart from a checkpoint rolls back, and with the drops freeing slots, it cannot leave
a learner waiting for a group nobody may start. Not from the version: a learner resumed on a new Ray
cluster publishes its checkpoint's weights under a new number (learner/weights.py `resume_version`),
ahead of the updates it has trained, and a limit counted from it stopped the pool two updates short of
max_steps (tests/test_cluster_resume.py timed out on it in CI).

A claim is one Redis transaction: the admitted count goes up together with the group's in-flight
listing, so a worker that dies leaves either nothing or a listed group that its successor marks
abandoned, which the learner counts as dropped; no slot leaks. Two workers that claim the last slot
at once both count themselves in, see the count past the limit and take their claims back; the next
check admits one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from slea.admission_counts import ADMITTED, AdmissionCounts, admission_key

# Why a claim was refused (the `reason` label of actor_throttled_seconds_total):
AHEAD_OF_LEARNER = "ahead_of_learner"  # the learner would train the group more than max_staleness versions on
RUN_END = "run_end"  # the updates left until learner.max_steps have their groups: the pool is done, not too fast


def outstanding_limit(max_staleness: int, tasks_per_step: int, weights_lag: int = 0) -> int:
    """Groups the pool may have started that the learner has not consumed (trained into a published
    version, or dropped) when a worker asks to start one: the batch the learner trains next and one
    batch for each of the next `max_staleness` versions. A worker whose weights are `weights_lag`
    versions behind the learner's plays a group that much older, so it may start one only while
    `weights_lag` fewer batches wait (none at all past `max_staleness`)."""
    return max(max_staleness - weights_lag + 1, 0) * tasks_per_step


@dataclass(frozen=True)
class StalenessBound:
    """What a worker asks of the admission hash before it starts a group."""

    max_staleness: int  # actors.max_staleness
    tasks_per_step: int  # learner.tasks_per_step
    playing_version: int  # the policy version of the weights the group would be played with
    max_steps: int | None = None  # learner.max_steps: the updates after which the learner stops (None: it does not)

    def staleness_limit(self, counts: AdmissionCounts) -> int:
        """Groups that may be outstanding by staleness, the lag taken from the learner's version as the
        hash has it (written with its trained count), not as the worker last polled it."""
        lag = max(counts.version - self.playing_version, 0)
        return outstanding_limit(self.max_staleness, self.tasks_per_step, lag)

    def limit(self, counts: AdmissionCounts) -> int:
        """Groups that may be outstanding: the staleness limit, and no more than the updates left until
        max_steps will train."""
        limit = self.staleness_limit(counts)
        if self.max_steps is not None:
            limit = min(limit, max(self.max_steps * self.tasks_per_step - counts.trained, 0))
        return limit

    def refusal(self, counts: AdmissionCounts) -> str | None:
        """None if a pool with these counts is within the bound, else why not: AHEAD_OF_LEARNER where the
        staleness limit is passed (the pool plays faster than the learner trains), else RUN_END."""
        if counts.outstanding <= self.limit(counts):
            return None
        return AHEAD_OF_LEARNER if counts.outstanding > self.staleness_limit(counts) else RUN_END


def claim_group(
    client: redis.Redis, run_id: str, inflight_key: str, episodes: dict[str, bytes], bound: StalenessBound | None
) -> str | None:
    """List a group's episodes in flight (episode id -> abandon-marker fields) and count the group
    admitted, in one transaction, and return None. If that puts the pool past the `bound` (by the
    counts as the transaction left them), take both back and return why (`StalenessBound.refusal`).
    `bound` None admits every group (a worker with no learner behind it)."""
    key = admission_key(run_id)
    claim = client.pipeline(transaction=True)
    claim.hset(inflight_key, mapping=episodes)
    claim.hincrby(key, ADMITTED, 1)
    claim.hgetall(key)
    counts = AdmissionCounts.from_hash(claim.execute()[-1])
    refusal = None if bound is None else bound.refusal(counts)
    if refusal is None:
        return None
    release = client.pipeline(transaction=True)
    release.hincrby(key, ADMITTED, -1)
    release.hdel(inflight_key, *episodes)
    release.execute()
    return refusal
