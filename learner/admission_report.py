"""The learner's side of the actors' staleness admission (actors/staleness_admission.py): it tells the pool,
through the run's admission hash (slea/admission_counts.py), how many groups it has consumed.

Trained groups are written as a total (HSET) from the learner's own state, which its checkpoint
keeps, once the version they trained is published: a learner restarted from a checkpoint rolls the
total back, and the groups it trained since are pending again in its stream and count as
outstanding until it trains them anew. Dropped groups
are added (HINCRBY) before their entries are acknowledged, so a crash in between counts a drop
twice, never not at all: admission then runs a group ahead, which the learner's own staleness drop
still catches, rather than a slot short.

What no rule above covers (a Redis that lost its last second of writes on a crash, a claim whose
reply was lost and retried) would leave a slot counted outstanding for ever, and enough of them
would stop the pool. So a learner that has waited `learner.group_timeout_s` with no group ready
counts what is really outstanding, the groups the workers list in flight and those it holds, and
counts the rest as dropped (`lost_groups`), as the timeout drops a group that never completes.
"""

from __future__ import annotations

import msgpack
import redis

from slea.admission_counts import DROPPED, TRAINED, VERSION, admission_key, read_counts
from slea.channels import inflight_pattern
from slea.redis_conn import with_reconnect
from slea.stream_admin import group_stats


class AdmissionReport:
    """Writes the learner's consumption into the run's admission hash."""

    def __init__(self, client: redis.Redis, run_id: str, reconnect_max_s: float):
        self.client = client
        self.run_id = run_id
        self.key = admission_key(run_id)
        self.reconnect_max_s = reconnect_max_s

    def _write(self, call):
        return with_reconnect(call, max_wait_s=self.reconnect_max_s, what="the learner's admission counts")

    def trained(self, total: int, version: int) -> None:
        """The learner's state has trained `total` groups since the run began, and published `version`."""
        self._write(lambda: self.client.hset(self.key, mapping={TRAINED: total, VERSION: version}))

    def dropped(self, count: int) -> None:
        """The learner dropped `count` more groups."""
        if count:
            self._write(lambda: self.client.hincrby(self.key, DROPPED, count))

    def lost_groups(self, held_group_ids: set[str], stream: str, group: str) -> int:
        """Outstanding groups that are neither listed in flight by a worker nor in `held_group_ids`
        (the learner's open and ready groups): lost, to be counted as dropped. None while the
        learner's consumer `group` has entries of `stream` still to read: a group played to its end
        but not yet read would be taken for lost. (One played to its end after that check still can
        be: admission then runs a group ahead, which is safe.)"""

        def lost() -> int:
            learner = group_stats(self.client, stream).get(group)
            if learner is None or learner.lag > 0:
                return 0
            # Counts first: a group claimed after this read is not counted here and is in flight below,
            # so it can never be taken for lost.
            outstanding = read_counts(self.client, self.run_id).outstanding
            in_flight = {
                msgpack.unpackb(fields)["group_id"]
                for key in self.client.scan_iter(match=inflight_pattern(self.run_id))
                for fields in self.client.hgetall(key).values()
            }
            return outstanding - len(in_flight | held_group_ids)

        return max(self._write(lost), 0)
