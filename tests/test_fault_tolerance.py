"""Fault tolerance end to end (issue 7, item 5), with the real components driven as `slea train`
drives them (Redis with AOF, Ray, the library writer and its Serve app, the learner, the actor
pool, a tiny model), so that each can be killed on purpose while the run goes:

an actor worker (Ray restarts it), the learner (a new LearnerProcess resumes from its checkpoint
and re-reads its pending entries), the library's Serve replica (Serve replaces it; actors count
misses meanwhile) and Redis itself (restarted on its AOF). Afterwards the counts must add up:
every finished episode trained on at most once, nothing acknowledged without its effect being
durable, abandoned episodes dropped, the policy version line without gap or repeat.
"""

import json
import os
import signal
import time

import pytest
import ray
from helpers import check_a_broken_run, learner_metrics, tiny_run
from ray import serve

from actors.pool import ActorPool
from learner.process import start_learner
from library.process import LibraryProcess
from library.service import start_serve_app
from slea.channels import LIBRARY_APP, RAY_NAMESPACE
from slea.config import load_config
from slea.embedded_redis import EmbeddedRedis
from slea.records import decode
from slea.redis_conn import connect
from slea.services import STREAM_GROUPS
from slea.streams import PAYLOAD_FIELD, ensure_group

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)
REDIS_OUTAGE_S = 3.0  # longer than redis-py's own few quick retries: the components' reconnect logic must carry it


class Run:
    """The components of one run, started as driver/train.py starts them, plus the levers to break them."""

    def __init__(self, config, run_dir):
        self.config, self.run_dir = config, run_dir
        self.as_dict = config.model_dump(mode="json")
        self.library = LibraryProcess.options(num_cpus=1).remote(self.as_dict, config.redis.url, str(run_dir))
        self.library_run = self.library.run.remote()
        start_serve_app(config, config.redis.url)
        self.start_learner()
        self.pool = ActorPool(config, config.redis.url)
        self.pool.scale(config.actors.num_workers)

    def start_learner(self) -> None:
        (self.learner,) = start_learner(self.config, num_cpus=1)
        self.learner_run = self.learner.run.remote()

    def version(self) -> int:
        return ray.get(self.learner.version.remote())

    def wait(self, predicate, what: str, timeout_s: float = 90) -> None:
        """Poll `predicate` while supervising the pool (as the driver does); fail naming `what`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.pool.supervise()
            if predicate():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")

    def retrieval_misses(self) -> int:
        return sum(summary["retrieval_misses"] for summary in self.pool.summaries())

    def stop(self) -> None:
        """Graceful order of driver/train.py: no new groups -> learner checkpoint -> library snapshot."""
        self.pool.stop()
        self.learner.stop.remote()
        ray.get(self.learner_run, timeout=120)
        self.library.stop.remote()
        ray.get(self.library_run, timeout=120)
        serve.shutdown()


def trained_steps(run_dir) -> list[dict]:
    """The learner's trace, one line per step it published (learner/learner.py _trace)."""
    path = run_dir / "learner" / "trained_groups.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def library_replicas() -> list[str]:
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and "REPLICA" in actor["name"] and LIBRARY_APP in actor["name"]
    ]


@pytest.fixture
def faulty_run(tmp_path, tiny_model_dir):
    server = EmbeddedRedis(tmp_path / "redis", appendonly=True).start()
    config = load_config(
        "configs/local.yaml",
        [
            *tiny_run(tmp_path, "faults", tiny_model_dir),
            f"redis.url={server.url}",
            "actors.num_workers=2",
            "actors.num_cpus=0.5",
            "actors.max_staleness=1000",
            "actors.retrieval_timeout_s=0.5",
            "learner.tasks_per_step=1",
            "learner.checkpoint_every=2",
            "learner.max_steps=1000",
            "learner.max_staleness=1000",
            "library.snapshot_every=1",
            "library.http_port=0",
        ],
    )
    client = connect(config.redis)
    for group in STREAM_GROUPS:
        ensure_group(client, config.stream_key(), group)
    ray.init(num_cpus=4, namespace=RAY_NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        yield Run(config, tmp_path / "faults"), server, client
    finally:
        serve.shutdown()
        ray.shutdown()
        client.close()
        server.stop()


def test_killing_every_component_loses_nothing_and_trains_nothing_twice(faulty_run):
    run, server, client = faulty_run
    stream = run.config.stream_key()
    run.wait(lambda: run.version() >= 2, "the first learner steps", timeout_s=150)

    # 1. An actor worker dies mid-episode; Ray restarts it and its successor marks the half episodes.
    ray.kill(run.pool.workers[0], no_restart=False)
    run.wait(
        lambda: any(decode(fields[PAYLOAD_FIELD]).abandoned for _id, fields in client.xrange(stream)),
        "the restarted worker's abandon markers",
    )
    run.wait(
        lambda: any(line["groups_dropped_abandoned"] for line in learner_metrics(run.run_dir)),
        "the learner to drop them",
    )

    # 2. The learner dies between checkpoints (every 2 steps: an odd step is published, not saved);
    # a new one resumes from its checkpoint, re-reads its pending entries and redoes the lost step.
    # It is frozen before its step is read (a tiny model trains several steps a second), so that it
    # dies at the step the test read.
    pid = ray.get(run.learner.__ray_call__.remote(lambda _learner: os.getpid()))
    deadline = time.monotonic() + 90
    while True:
        os.kill(pid, signal.SIGSTOP)
        last = trained_steps(run.run_dir)[-1]
        if last["learner_step"] % 2 == 1:
            break
        os.kill(pid, signal.SIGCONT)  # frozen on a checkpointed step: a little further
        assert time.monotonic() < deadline, "no learner step published but not checkpointed in 90 s"
        run.pool.supervise()
        time.sleep(0.2)
    killed_at = last["policy_version"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(run.learner_run, timeout=30)
    run.start_learner()
    run.wait(lambda: run.version() >= killed_at + 2, "the restarted learner's steps")

    # 3. The library's Serve replica dies; Serve replaces it, actors go on without experiences meanwhile.
    old_replicas = library_replicas()
    misses_before = run.retrieval_misses()
    ray.kill(ray.get_actor(old_replicas[0], namespace="serve"), no_restart=True)
    run.wait(lambda: run.retrieval_misses() > misses_before, "retrieval misses while the replica is down")
    run.wait(
        lambda: (
            (set(library_replicas()) - set(old_replicas))
            and serve.status().applications[LIBRARY_APP].status == "RUNNING"
        ),
        "Serve to replace the replica",
    )

    # 4. Redis goes away for a few seconds and comes back from its AOF: nothing written before is
    # lost, every component reconnects.
    last_before = client.xrevrange(stream, count=1)[0][0]
    length_before = client.xlen(stream)
    server.stop(remove_data=False)
    time.sleep(REDIS_OUTAGE_S)
    server.start()
    assert client.xlen(stream) >= length_before and client.xrange(stream, min=last_before, max=last_before)
    version_after_restart = run.version()
    run.wait(lambda: run.version() >= version_after_restart + 2, "learner steps after the Redis restart")
    run.wait(lambda: client.xlen(stream) > length_before + 20, "actors producing after the Redis restart")

    run.stop()
    check_a_broken_run(run.run_dir, run.config, client)
