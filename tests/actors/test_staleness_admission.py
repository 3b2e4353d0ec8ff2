"""Staleness admission (actors/staleness_admission.py) against a real Redis: the limit by hand, a claim and its
release, workers claiming at once, and a pool-and-learner simulation that keeps every trained group
within max_staleness versions."""

import threading
from collections import deque

import msgpack
import pytest

from actors.staleness_admission import AHEAD_OF_LEARNER, RUN_END, StalenessBound, claim_group, outstanding_limit
from slea.admission_counts import TRAINED, VERSION, AdmissionCounts, admission_key, read_counts
from slea.channels import inflight_key


def listing(group_id: str, size: int = 2) -> dict[str, bytes]:
    return {
        f"{group_id}-{index}": msgpack.packb({"group_id": group_id, "episode_id": f"{group_id}-{index}"})
        for index in range(size)
    }


def test_the_limit_is_one_batch_now_and_one_for_each_later_version():
    assert outstanding_limit(max_staleness=4, tasks_per_step=2) == 10
    assert outstanding_limit(max_staleness=1, tasks_per_step=2) == 4
    assert outstanding_limit(max_staleness=0, tasks_per_step=16) == 16  # fully synchronous: one batch
    # A worker with older weights plays older groups: a batch less for each version it lags.
    assert outstanding_limit(max_staleness=4, tasks_per_step=2, weights_lag=1) == 8
    assert outstanding_limit(max_staleness=1, tasks_per_step=2, weights_lag=1) == 2
    assert outstanding_limit(max_staleness=1, tasks_per_step=2, weights_lag=3) == 0


def test_outstanding_is_admitted_less_trained_less_dropped():
    assert AdmissionCounts.from_hash({b"admitted": b"12", b"trained": b"6", b"dropped": b"2"}).outstanding == 4
    assert AdmissionCounts.from_hash({}) == AdmissionCounts(0, 0, 0)  # a new run has no hash yet


def test_the_bound_takes_the_lag_from_the_learners_version_in_the_counts():
    bound = StalenessBound(max_staleness=1, tasks_per_step=2, playing_version=3)
    assert bound.limit(AdmissionCounts(admitted=9, trained=6, dropped=0, version=3)) == 4
    assert bound.limit(AdmissionCounts(admitted=9, trained=8, dropped=0, version=4)) == 2  # a version behind
    assert bound.limit(AdmissionCounts(admitted=0, trained=0, dropped=0, version=0)) == 4  # weights ahead: no lag


def test_a_claim_lists_the_group_in_flight_and_one_past_the_limit_takes_both_back(redis_client):
    key = inflight_key("r", 0)
    bound = StalenessBound(max_staleness=0, tasks_per_step=2, playing_version=0)
    assert claim_group(redis_client, "r", key, listing("g1"), bound) is None
    assert claim_group(redis_client, "r", key, listing("g2"), bound) is None
    assert claim_group(redis_client, "r", key, listing("g3"), bound) == AHEAD_OF_LEARNER
    assert read_counts(redis_client, "r") == AdmissionCounts(admitted=2, trained=0, dropped=0)
    assert sorted(redis_client.hkeys(key)) == [b"g1-0", b"g1-1", b"g2-0", b"g2-1"]  # g3 is not listed
    # The learner trained both into version 1: two slots free, but not for a worker still on version 0.
    redis_client.hset(admission_key("r"), mapping={TRAINED: 2, VERSION: 1})
    assert claim_group(redis_client, "r", key, listing("g3"), bound) == AHEAD_OF_LEARNER
    assert claim_group(redis_client, "r", key, listing("g3"), StalenessBound(0, 2, playing_version=1)) is None
    assert read_counts(redis_client, "r").outstanding == 1


def test_no_bound_admits_everything(redis_client):
    for index in range(5):
        assert claim_group(redis_client, "r", inflight_key("r", 0), listing(f"g{index}"), None) is None
    assert read_counts(redis_client, "r").admitted == 5


def test_workers_claiming_at_once_never_pass_the_limit(redis_url):
    """Eight workers (threads, each with its own connection) claim 10 groups each against a limit of 5
    (max_staleness 4, one group a learner step)."""
    import redis

    admitted: list[str] = []
    start = threading.Barrier(8)

    def worker(index: int) -> None:
        client = redis.Redis.from_url(redis_url)
        start.wait()
        for number in range(10):
            group = f"w{index}-g{number}"
            if claim_group(client, "r", inflight_key("r", index), listing(group), StalenessBound(4, 1, 0)) is None:
                admitted.append(group)
        client.close()

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    client = redis.Redis.from_url(redis_url)
    assert 1 <= len(admitted) <= 5  # racing claims may all back off, never more than the limit pass
    assert read_counts(client, "r").admitted == len(admitted)
    listed = {msgpack.unpackb(v)["group_id"] for i in range(8) for v in client.hgetall(inflight_key("r", i)).values()}
    assert listed == set(admitted)


@pytest.mark.parametrize(("max_staleness", "weights_lag"), [(0, 0), (1, 0), (4, 0), (1, 1), (4, 2)])
def test_a_pool_ahead_of_its_learner_trains_nothing_staler_than_the_bound(redis_client, max_staleness, weights_lag):
    """A pool that plays far faster than its learner (every group it is allowed is played at once, in
    the order admitted, with weights `weights_lag` versions behind the learner's) and a learner that
    trains `tasks_per_step` groups a version and counts them consumed once the version is published:
    every group is trained at most `max_staleness` versions after the version it was played with."""
    tasks_per_step = 3
    version, played = weights_lag, deque()  # (group id, policy version it was played with), in completion order
    redis_client.hset(admission_key("r"), VERSION, version)
    staleness = []
    for number in range(200):
        group = f"g{number}"
        bound = StalenessBound(max_staleness, tasks_per_step, playing_version=version - weights_lag)
        while claim_group(redis_client, "r", inflight_key("r", 0), listing(group), bound) is not None:
            batch = [played.popleft() for _ in range(tasks_per_step)]  # the learner trains a batch
            staleness += [version - played_with for _, played_with in batch]
            version += 1
            trained = (version - weights_lag) * tasks_per_step
            redis_client.hset(admission_key("r"), mapping={TRAINED: trained, VERSION: version})
            bound = StalenessBound(max_staleness, tasks_per_step, playing_version=version - weights_lag)
        played.append((group, version - weights_lag))
    assert max(staleness) == max_staleness  # the pool runs as far ahead as allowed, and no further
    assert len(staleness) >= 200 - outstanding_limit(max_staleness, tasks_per_step, weights_lag)


def test_the_bound_admits_no_more_than_the_updates_left_until_max_steps_train():
    # 2 updates of one group (configs/local.yaml): two groups before any is trained, then one, then
    # none, however far the staleness bound (5 groups) would reach.
    bound = StalenessBound(max_staleness=4, tasks_per_step=1, playing_version=0, max_steps=2)
    assert bound.limit(AdmissionCounts(admitted=0, trained=0, dropped=0, version=0)) == 2
    assert bound.limit(AdmissionCounts(admitted=2, trained=1, dropped=0, version=1)) == 1
    assert bound.limit(AdmissionCounts(admitted=2, trained=2, dropped=0, version=2)) == 0
    # 3 updates of 2 groups, 2 trained at version 1: min((4 + 1) x 2, 3 x 2 - 2) = 4; the staleness
    # bound is the lower one far from the end: min((1 + 1) x 2, 10 x 2 - 2) = 4
    assert StalenessBound(4, 2, 1, max_steps=3).limit(AdmissionCounts(4, 2, 0, version=1)) == 4
    assert StalenessBound(1, 2, 1, max_steps=10).limit(AdmissionCounts(4, 2, 0, version=1)) == 4
    assert StalenessBound(1, 2, 1, max_steps=None).limit(AdmissionCounts(4, 2, 0, version=1)) == 4


def test_a_learner_resumed_on_a_new_cluster_gets_the_groups_of_every_update_left():
    # tests/test_cluster_resume.py as CI ran it: one group an update, checkpoint after update 15, the
    # cluster killed after update 17 (version 17 recorded in Redis), resumed with max_steps 19. The
    # learner publishes the checkpoint's weights as version 18 (learner/weights.py resume_version) at
    # learner step 15: four updates (16-19) are left, whatever the version says. 18 groups were
    # admitted: 17 trained before the kill, one cut short in flight and since dropped as abandoned.
    counts = AdmissionCounts(admitted=18, trained=15, dropped=1, version=18)
    bound = StalenessBound(max_staleness=4, tasks_per_step=1, playing_version=18, max_steps=19)
    assert bound.limit(counts) == 4  # min((4 + 1) x 1, 19 x 1 - 15); counted from the version: (19 - 18) x 1 = 1
    # The groups of updates 16 and 17 are pending again in the learner's stream (outstanding 2): two
    # new groups may start, and the four updates left have their four groups.
    assert counts.outstanding == 2


def test_a_short_run_starts_no_group_past_its_last_update_and_a_drop_or_a_rollback_frees_a_slot(redis_client):
    key = inflight_key("r", 0)
    bound = StalenessBound(max_staleness=4, tasks_per_step=1, playing_version=0, max_steps=2)
    assert claim_group(redis_client, "r", key, listing("g1"), bound) is None
    assert claim_group(redis_client, "r", key, listing("g2"), bound) is None
    assert claim_group(redis_client, "r", key, listing("g3"), bound) == RUN_END  # nothing would train it
    redis_client.hset(admission_key("r"), mapping={TRAINED: 1, VERSION: 1})  # update 1 trained g1
    assert claim_group(redis_client, "r", key, listing("g3"), bound) == RUN_END  # g2 is update 2's
    redis_client.hincrby(admission_key("r"), "dropped", 1)  # the learner dropped g2 (abandoned, stale)
    assert claim_group(redis_client, "r", key, listing("g3"), bound) is None  # its replacement
    # A learner restarted from the checkpoint before update 1: version and trained roll back, g1 is
    # pending again and outstanding, and the one slot left is not enough for a new group.
    redis_client.hset(admission_key("r"), mapping={TRAINED: 0, VERSION: 0})
    assert read_counts(redis_client, "r").outstanding == 2
    assert claim_group(redis_client, "r", key, listing("g4"), bound) == RUN_END
