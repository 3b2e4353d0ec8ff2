"""Group assembly rules: completeness, duplicates, abandoned, timeout, staleness, acks."""

from learner.groups import GroupAssembler
from slea.records import StepRecord
from slea.streams import Delivery


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def step(group, episode, index, done=False, version=0, abandoned=False):
    record = StepRecord(
        run_id="r",
        task_id="t",
        task_type="x",
        env_name="e",
        group_id=group,
        episode_id=episode,
        step=index,
        anchor_obs=f"obs{index}",
        done=done,
        policy_version=version,
        abandoned=abandoned,
    )
    return Delivery(entry_id=f"{group}-{episode}-{index}-{id(record)}", record=record)


def episode(group, name, length, version=0):
    return [step(group, name, i, done=i == length - 1, version=version) for i in range(length)]


def test_group_is_ready_when_all_episodes_are_done_in_any_order():
    assembler = GroupAssembler(group_size=2, timeout_s=10, max_staleness=4)
    deliveries = episode("g", "a", 3) + episode("g", "b", 2)
    assert assembler.add(list(reversed(deliveries[1:]))) == []
    assert assembler.pop_ready(4) == []  # a's step 0 is missing
    assembler.add(deliveries[:1])
    assert assembler.drop_stale(current_version=0) == []
    groups = assembler.pop_ready(4)
    assert len(groups) == 1
    assert [(r.episode_id, r.step) for r in groups[0].records] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert sorted(groups[0].entry_ids) == sorted(d.entry_id for d in deliveries)


def test_duplicates_are_applied_once_and_acked_with_the_group():
    assembler = GroupAssembler(group_size=1, timeout_s=10, max_staleness=4)
    first = episode("g", "a", 2)
    again = [step("g", "a", 0)]  # the same step delivered in another entry
    assembler.add(first[:1] + again + first[1:])
    groups = assembler.pop_ready(4)
    assert len(groups[0].records) == 2
    assert len(groups[0].entry_ids) == 3
    assert assembler.counters.duplicates == 1
    late = [step("g", "a", 1)]  # redelivered after the group was trained: acknowledged, not re-buffered
    assert assembler.add(late) == [late[0].entry_id]
    assert assembler.open_groups == 0


def test_abandoned_episode_drops_the_group():
    assembler = GroupAssembler(group_size=2, timeout_s=10, max_staleness=4)
    held = episode("g", "a", 2) + [step("g", "b", 0)]
    assembler.add(held)
    marker = step("g", "b", 1, abandoned=True)
    ack = assembler.add([marker])
    assert sorted(ack) == sorted(d.entry_id for d in held + [marker])
    assert assembler.counters.groups_dropped["abandoned"] == 1
    assert assembler.add([step("g", "c", 0)]) != []  # later steps of the group are dropped too
    assert assembler.pop_ready(4) == []


def test_incomplete_group_times_out():
    clock = Clock()
    assembler = GroupAssembler(group_size=2, timeout_s=10, max_staleness=4, clock=clock)
    held = episode("g", "a", 2)
    assembler.add(held)
    assembler.add(episode("h", "a", 1))
    clock.now = 10.0
    assert assembler.expire() == []
    clock.now = 10.5
    assert len(assembler.expire()) == 3  # both groups: 2 + 1 entries
    assert assembler.counters.groups_dropped["timeout"] == 2
    assert assembler.open_groups == 0


def test_stale_groups_are_dropped_and_fresh_ones_kept():
    assembler = GroupAssembler(group_size=1, timeout_s=10, max_staleness=2)
    stale = episode("old", "a", 2, version=3)
    fresh = episode("new", "a", 1, version=4)
    assembler.add(stale + fresh)
    dropped = assembler.drop_stale(current_version=6)
    assert [g.group_id for g in assembler.pop_ready(4)] == ["new"]
    assert sorted(dropped) == sorted(d.entry_id for d in stale)
    assert assembler.counters.groups_dropped["stale"] == 1


def test_pop_ready_takes_at_most_max_groups_oldest_first():
    assembler = GroupAssembler(group_size=1, timeout_s=10, max_staleness=4)
    for name in ("g1", "g2", "g3"):
        assembler.add(episode(name, "a", 1))
    first = assembler.pop_ready(2)
    second = assembler.pop_ready(2)
    assert [g.group_id for g in first] == ["g1", "g2"] and [g.group_id for g in second] == ["g3"]
