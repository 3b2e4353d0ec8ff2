"""Group assembly: stream deliveries -> complete task groups, ready to train on.

Steps arrive interleaved from many actors, possibly twice (at-least-once delivery), possibly
never (a dead worker). A group is ready when all G of its episodes are done, i.e. each has a
`done` step and every step before it. Everything that cannot be trained on as a complete group
is dropped *deliberately* and counted: a group with an abandoned episode, a group not complete
within the timeout, a group holding steps older than `max_staleness` versions. Dropped entries
are returned for acknowledgement at once; entries of ready groups travel with the group and are
acknowledged by the learner only after the update that used them is checkpointed.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from slea.records import StepRecord
from slea.streams import Delivery

# Ids of closed groups remembered so late or redelivered steps are acknowledged, not re-buffered.
_CLOSED_MEMORY = 100_000


@dataclass
class ReadyGroup:
    """A complete task group: every step of its G episodes, once."""

    group_id: str  # the task group
    records: list[StepRecord]  # all steps, ordered by (episode_id, step)
    entry_ids: list[str]  # every stream entry that carried them, duplicates included (ack all)


@dataclass
class _GroupBuffer:
    first_seen: float  # monotonic seconds of the first step, for the timeout
    steps: dict[tuple[str, int], StepRecord] = field(default_factory=dict)  # (episode_id, step) -> record
    last_step: dict[str, int] = field(default_factory=dict)  # episode_id -> index of its done step
    entry_ids: list[str] = field(default_factory=list)  # entries delivered for this group


@dataclass
class AssemblyCounters:
    """Running totals since the learner started; exported as metrics."""

    duplicates: int = 0  # deliveries of an (episode_id, step) already held
    groups_ready: int = 0  # groups handed to training
    groups_dropped: Counter = field(default_factory=Counter)  # reason -> groups dropped (abandoned, timeout, stale)
    steps_dropped: Counter = field(default_factory=Counter)  # reason -> step entries acknowledged without training


class GroupAssembler:
    """Buffers steps by group and episode; see the module docstring for the rules."""

    def __init__(
        self, group_size: int, timeout_s: float, max_staleness: int, clock: Callable[[], float] = time.monotonic
    ):
        self.group_size = group_size
        self.timeout_s = timeout_s
        self.max_staleness = max_staleness
        self.clock = clock
        self.counters = AssemblyCounters()
        self._open: dict[str, _GroupBuffer] = {}
        self._ready: list[str] = []  # complete groups in completion order
        self._closed: OrderedDict[str, str] = OrderedDict()  # group_id -> why it closed

    @property
    def open_groups(self) -> int:
        return len(self._open)

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    @property
    def held_group_ids(self) -> set[str]:
        """Every group buffered, complete or not."""
        return set(self._open)

    @property
    def held_entry_ids(self) -> set[str]:
        """The stream entries of every group buffered (none of them acknowledged yet)."""
        return {entry_id for group in self._open.values() for entry_id in group.entry_ids}

    @property
    def groups_dropped(self) -> int:
        """Groups dropped so far, whatever the reason."""
        return sum(self.counters.groups_dropped.values())

    def add(self, deliveries: list[Delivery]) -> list[str]:
        """Buffer deliveries; returns entry ids to acknowledge now (steps of already closed groups)."""
        ack_now: list[str] = []
        for delivery in deliveries:
            record = delivery.record
            closed_reason = self._closed.get(record.group_id)
            if closed_reason is not None:
                self.counters.steps_dropped["late_" + closed_reason] += 1
                ack_now.append(delivery.entry_id)
                continue
            group = self._open.get(record.group_id)
            if group is None:
                group = self._open[record.group_id] = _GroupBuffer(first_seen=self.clock())
            group.entry_ids.append(delivery.entry_id)
            if record.abandoned:
                ack_now += self._close(record.group_id, "abandoned")
                continue
            if record.key() in group.steps:
                self.counters.duplicates += 1
                continue
            group.steps[record.key()] = record
            if record.done:
                group.last_step[record.episode_id] = record.step
            if self._complete(group) and record.group_id not in self._ready:
                self._ready.append(record.group_id)
        return ack_now

    def _complete(self, group: _GroupBuffer) -> bool:
        if len(group.last_step) < self.group_size:
            return False
        held = Counter(episode for episode, _ in group.steps)
        return all(held[episode] == last + 1 for episode, last in group.last_step.items())

    def expire(self) -> list[str]:
        """Drop groups open longer than the timeout; returns their entry ids to acknowledge."""
        now = self.clock()
        expired = [
            gid
            for gid, group in self._open.items()
            if gid not in self._ready and now - group.first_seen > self.timeout_s
        ]
        ack_now: list[str] = []
        for group_id in expired:
            ack_now += self._close(group_id, "timeout")
        return ack_now

    def drop_stale(self, current_version: int) -> list[str]:
        """Drop ready groups holding a step more than `max_staleness` versions old; returns entry ids to ack."""
        stale = [
            group_id
            for group_id in self._ready
            if current_version - min(record.policy_version for record in self._open[group_id].steps.values())
            > self.max_staleness
        ]
        ack_now: list[str] = []
        for group_id in stale:
            ack_now += self._close(group_id, "stale")
        return ack_now

    def pop_ready(self, max_groups: int) -> list[ReadyGroup]:
        """Up to `max_groups` complete groups, oldest first (call `drop_stale` before)."""
        groups: list[ReadyGroup] = []
        while self._ready and len(groups) < max_groups:
            group_id = self._ready.pop(0)
            group = self._open.pop(group_id)
            self._remember(group_id, "trained")
            records = sorted(group.steps.values(), key=lambda record: (record.episode_id, record.step))
            groups.append(ReadyGroup(group_id, records, group.entry_ids))
            self.counters.groups_ready += 1
        return groups

    def _close(self, group_id: str, reason: str) -> list[str]:
        group = self._open.pop(group_id)
        if group_id in self._ready:
            self._ready.remove(group_id)
        self._remember(group_id, reason)
        self.counters.groups_dropped[reason] += 1
        self.counters.steps_dropped[reason] += len(group.entry_ids)
        return group.entry_ids

    def _remember(self, group_id: str, reason: str) -> None:
        self._closed[group_id] = reason
        while len(self._closed) > _CLOSED_MEMORY:
            self._closed.popitem(last=False)
