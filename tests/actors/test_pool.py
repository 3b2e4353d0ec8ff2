"""The actor pool on a real local Ray, writing to a real Redis stream, with a tiny model."""

import time
from collections import defaultdict

import numpy as np
import pytest
import ray
import redis
from helpers import forward_logprobs

from actors.pool import PROCESS_RESTARTED, ActorPool
from learner.weights import RayWeightPublisher
from slea.admission_counts import TRAINED, VERSION, admission_key, read_counts
from slea.channels import RAY_NAMESPACE, sync_claims_key
from slea.config import load_config
from slea.models import tiny_model
from slea.records import StepRecord, decode
from slea.streams import PAYLOAD_FIELD

pytestmark = pytest.mark.slow


def pool_config(run_id, tiny_model_dir, *extra):
    return load_config(
        None,
        [
            f"run.id={run_id}",
            "run.preset=custom",
            f"model.name={tiny_model_dir}",
            "model.max_new_tokens=6",
            "model.max_prompt_tokens=1024",
            "envs.name=alfworld",
            "envs.params.difficulty=easy",
            "envs.budgets=[2,3]",
            "envs.panel_size=4",
            "actors.num_workers=2",
            "actors.envs_per_worker=4",
            "actors.group_size=4",
            "actors.ab_groups=true",
            "actors.num_cpus=0.5",
            "actors.retrieval_mode=none",
            *extra,
        ],
    )


def stream_records(client, config) -> list[StepRecord]:
    return [decode(fields[PAYLOAD_FIELD]) for _id, fields in client.xrange(config.stream_key())]


def wait_for(predicate, what: str, timeout_s: float = 240, interval_s: float = 0.5) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(interval_s)


def episodes_of(records):
    episodes = defaultdict(list)
    for record in records:
        episodes[record.episode_id].append(record)
    return episodes


def assert_complete_or_abandoned(records) -> None:
    """No half episode passes for a complete one: each is contiguous and done, or marked abandoned."""
    for episode_id, steps in episodes_of(records).items():
        real = sorted((r for r in steps if not r.abandoned), key=lambda r: r.step)
        complete = bool(real) and real[-1].done and [r.step for r in real] == list(range(len(real)))
        abandoned = any(r.abandoned for r in steps)
        assert complete != abandoned, f"episode {episode_id} is neither complete nor marked abandoned"


def test_pool_plays_groups_into_the_stream_as_far_as_admission_allows(ray_cluster, redis_url, tiny_model_dir):
    # Staleness admission (actors/staleness_admission.py): with 2 groups a learner step and max_staleness 1, the
    # two workers together start 4 groups (16 episodes), then wait for a learner that consumes them.
    config = pool_config("pool-groups", tiny_model_dir, "learner.tasks_per_step=2", "actors.max_staleness=1")
    client = redis.Redis.from_url(redis_url)
    pool = ActorPool(config, redis_url)
    pool.scale(2)
    wait_for(lambda: sum(r.done for r in stream_records(client, config)) >= 16, "16 finished episodes")
    wait_for(
        lambda: all(s["throttled_s"] >= 3 for s in pool.summaries()) and len(pool.summaries()) == 2,
        "both workers held back by the admission",
    )
    # A held-back worker's claim counts itself in and takes itself back in two transactions
    # (claim_group), so a read can land between them and see one more: wait that moment out.
    wait_for(lambda: read_counts(client, config.run.id).admitted == 4, "4 groups admitted", timeout_s=30)
    assert len({r.group_id for r in stream_records(client, config)}) == 4
    # A learner step trains 2 groups into version 1 and publishes it. The waiting workers only stage
    # the new weights (a generation applies them), yet they count as on version 1: 2 more groups start.
    publisher = RayWeightPublisher(config.run.id)
    publisher.publish(1, tiny_model(seed=9)[0].state_dict())
    publisher.flush()
    client.hset(admission_key(config.run.id), mapping={TRAINED: 2, VERSION: 1})
    wait_for(lambda: len({r.group_id for r in stream_records(client, config)}) == 6, "two more groups")
    summaries = pool.stop()
    assert read_counts(client, config.run.id).admitted == 6
    ray.kill(ray.get_actor(f"slea-weights-{config.run.id}", namespace=RAY_NAMESPACE))
    assert len(summaries) == 2 and all(s["groups_started"] >= 1 for s in summaries)
    records = stream_records(client, config)
    by_group = defaultdict(set)
    for episode_id, steps in episodes_of(records).items():
        if any(step.abandoned for step in steps):
            continue  # cut short by the stop: marked, never complete
        steps.sort(key=lambda r: r.step)
        assert [r.step for r in steps] == list(range(len(steps)))  # contiguous
        assert steps[-1].done and not any(r.done for r in steps[:-1])
        assert len(steps) <= steps[0].step_budget and steps[0].step_budget in (2, 3)
        assert len({r.task_id for r in steps}) == 1
        assert all(len(r.response_ids) == len(r.response_logprobs) > 0 for r in steps)
        by_group[steps[0].group_id].add((episode_id, steps[0].with_experience))
    # The first 4 groups played the initial weights, those admitted after the publish version 1.
    played_with = [{r.policy_version for r in records if r.group_id == group and not r.abandoned} for group in by_group]
    assert played_with.count({0}) == 4 and all(versions == {1} for versions in played_with if versions != {0})
    complete = [members for members in by_group.values() if len(members) == 4]
    assert complete, "no group finished all of its 4 episodes"
    for members in complete:  # retrieval is off: nobody is experience-conditioned
        assert [flag for _e, flag in sorted(members)] == [False] * 4


def test_ab_groups_split_with_and_without_experience(ray_cluster, redis_url, tiny_model_dir):
    config = pool_config(
        "pool-ab",
        tiny_model_dir,
        "actors.retrieval_mode=step",
        "actors.retrieval_timeout_s=0.2",
        "actors.num_workers=1",
    )
    client = redis.Redis.from_url(redis_url)
    pool = ActorPool(config, redis_url)
    pool.scale(1)  # no library is deployed: every retrieval is a miss, the pool still produces
    wait_for(lambda: sum(r.done for r in stream_records(client, config)) >= 4, "4 finished episodes")
    (summary,) = pool.stop()
    assert summary["retrieval_misses"] > 0
    flags = defaultdict(dict)
    for record in stream_records(client, config):
        if not record.abandoned:
            flags[record.group_id][record.episode_id] = record.with_experience
            assert record.library_version == -1 and record.experience_ids == []
    complete = [members for members in flags.values() if len(members) == 4]
    assert complete, "no group finished all of its 4 episodes"
    for members in complete:
        assert [members[k] for k in sorted(members)] == [True, True, False, False]


def test_published_weights_reach_the_next_steps(ray_cluster, redis_url, tiny_model_dir):
    # float32 generation: the recorded log-probs are compared with a float32 forward of the new weights
    config = pool_config("pool-weights", tiny_model_dir, "actors.num_workers=1", "actors.dtype=float32")
    client = redis.Redis.from_url(redis_url)
    pool = ActorPool(config, redis_url)
    pool.scale(1)
    wait_for(lambda: len(stream_records(client, config)) >= 2, "the first steps")
    new_model, _ = tiny_model(seed=9)
    publisher = RayWeightPublisher(config.run.id)
    publisher.publish(1, {k: v.clone() for k, v in new_model.state_dict().items()})
    publisher.flush()
    wait_for(lambda: any(r.policy_version == 1 for r in stream_records(client, config)), "a step of version 1")
    pool.stop()
    updated = [r for r in stream_records(client, config) if r.policy_version == 1]
    for record in updated[:3]:
        expected = forward_logprobs(new_model, record.prompt_ids, record.response_ids)
        np.testing.assert_allclose(record.response_logprobs, expected, atol=2e-4)
    versions = [r.policy_version for r in stream_records(client, config) if not r.abandoned]
    assert versions == sorted(versions)  # a worker never goes back to older weights
    ray.kill(ray.get_actor(f"slea-weights-{config.run.id}", namespace=RAY_NAMESPACE))


def test_killed_worker_leaves_no_half_episode_and_the_pool_refills(ray_cluster, redis_url, tiny_model_dir):
    config = pool_config("pool-kill", tiny_model_dir, "actors.num_workers=1", "envs.budgets=[6]")
    client = redis.Redis.from_url(redis_url)
    pool = ActorPool(config, redis_url)
    pool.scale(1)
    worker = pool.workers[0]
    wait_for(lambda: len(stream_records(client, config)) >= 3, "the first steps")
    assert len(pool.summaries()) == 1
    ray.kill(worker, no_restart=False)  # the process dies mid-episode; Ray restarts the actor
    assert len(pool.summaries()) == 1  # restarting or restarted: the driver's display loop goes on

    restarts = []

    def marked_while_supervised() -> bool:  # the driver supervises every poll: the restarted worker's
        restarts.extend(pool.supervise())  # loop starts again and first marks its predecessor's half episodes abandoned
        return any(r.abandoned for r in stream_records(client, config))

    wait_for(marked_while_supervised, "the restarted worker's abandon markers", timeout_s=120, interval_s=1)
    restarts.extend(pool.supervise())  # the answer is in once the markers are: the loop wrote them
    assert restarts == [(0, PROCESS_RESTARTED)]  # reported once, for the driver's log line and restart counter
    killed_at = len(stream_records(client, config))
    wait_for(
        lambda: sum(r.done and not r.abandoned for r in stream_records(client, config)[killed_at:]) >= 4,
        "4 episodes finished after the restart",
    )
    pool.stop()
    assert_complete_or_abandoned(stream_records(client, config))


def test_synchronous_mode_plays_one_batch_per_version(ray_cluster, redis_url, tiny_model_dir):
    config = pool_config("pool-sync", tiny_model_dir, "actors.synchronous=true", "learner.tasks_per_step=2")
    client = redis.Redis.from_url(redis_url)
    pool = ActorPool(config, redis_url)
    pool.scale(2)

    def groups_at(version):
        return {r.group_id for r in stream_records(client, config) if r.policy_version == version and not r.abandoned}

    def done_at(version):
        return sum(r.done for r in stream_records(client, config) if r.policy_version == version and not r.abandoned)

    def refused(version) -> int:
        """Groups asked for at `version` beyond its batch: a worker whose group is done asks for
        another, is refused and waits for the next version (actors/worker.py _sync_slot_claimed)."""
        return int(client.hget(sync_claims_key(config.run.id), str(version)) or 0) - 2

    for version in (0, 1):
        # The batch of the version (2 groups of 4) is done and the workers asked past it: refused.
        wait_for(lambda v=version: done_at(v) >= 8 and refused(v) >= 2, f"the workers refused at version {version}")
        assert len(groups_at(version)) == 2 and done_at(version) == 8
        if version == 0:
            publisher = RayWeightPublisher(config.run.id)
            publisher.publish(1, tiny_model(seed=9)[0].state_dict())
            publisher.flush()
    assert len(groups_at(0)) == 2, "a group was played on version 0 after its batch"
    pool.stop()
    ray.kill(ray.get_actor(f"slea-weights-{config.run.id}", namespace=RAY_NAMESPACE))


def test_workers_are_added_and_removed_while_the_pool_runs(ray_cluster, redis_url, tiny_model_dir):
    config = pool_config("pool-scale", tiny_model_dir, "actors.num_workers=1", "envs.budgets=[6]")
    client = redis.Redis.from_url(redis_url)
    pool = ActorPool(config, redis_url)
    pool.scale(1)
    wait_for(lambda: len(stream_records(client, config)) >= 2, "the first steps")
    pool.scale(2)  # add one while the first is mid-group: scale() does not wait for it to load
    wait_for(
        lambda: any(s["worker"] == 1 and s["groups_started"] >= 1 for s in pool.summaries()), "worker 1's first group"
    )
    assert pool.alive == 2
    pool.scale(1)  # remove it again: it stops in the background, its episodes in flight marked abandoned
    assert sorted(pool.workers) == [0]
    wait_for(lambda: pool.reap() == 0, "the removed worker to stop", timeout_s=60)
    wait_for(lambda: len(stream_records(client, config)) >= 12, "12 steps")  # the remaining worker keeps producing
    pool.stop()
    assert_complete_or_abandoned(stream_records(client, config))


def test_a_worker_waiting_for_resources_holds_nothing_up(ray_cluster, redis_url, tiny_model_dir):
    """On a cluster a new worker waits for the autoscaler's node; until then the driver's loop goes on."""
    config = pool_config("pool-pending", tiny_model_dir, "actors.num_workers=1", "actors.resources={nowhere: 1}")
    pool = ActorPool(config, redis_url)
    started = time.monotonic()
    pool.scale(1)
    assert pool.supervise() == [] and pool.summaries() == [] and pool.alive == 0
    pool.scale(0)  # never placed: killed at once, nothing to abandon
    assert pool.workers == {} and pool.reap() == 0 and pool.stop() == []
    assert time.monotonic() - started < 10
