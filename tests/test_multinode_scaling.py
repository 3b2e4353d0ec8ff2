"""Scaling the actor pool of a running `slea train` across nodes, on Ray's own autoscaler (issue 13).

`ray.cluster_utils.AutoscalingCluster` runs the real Ray autoscaler with nodes as processes on
this machine: a head that offers no component's resource, and node types for actors
(`actor_pool`, one worker each), the learner (`learner_pool`) and the library (`library_pool`),
all starting at 0 nodes, as configs/cluster.yaml pins the components on KubeRay. `slea train`
joins it with `ray.address`; the test runs the real `slea scale` CLI to take the pool 1 -> 3 -> 1
mid-run and watches the autoscaler start two actor nodes and later remove them. Afterwards the
stream must add up: every episode complete or abandoned, no acknowledged step lost, the version
line continuous (the learner never restarted).

It prints how long 1 -> 3 took: from `slea scale` and from the autoscaler's node registering to
the first step of a new worker's group in the stream (run with -s to see it).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import ray
import redis
from helpers import LocalAutoscalingCluster, audit_the_stream, lineage, tiny_run

from slea.channels import inflight_key
from slea.records import decode
from slea.streams import PAYLOAD_FIELD

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)
SLEA = [sys.executable, "-m", "driver.cli"]
MB = 1024**2
NODE_TYPES = {
    "ray.actor": {"resources": {"CPU": 1, "actor_pool": 1, "object_store_memory": 150 * MB}, "max_workers": 3},
    "ray.learner": {"resources": {"CPU": 1, "learner_pool": 1, "object_store_memory": 300 * MB}, "max_workers": 1},
    "ray.library": {"resources": {"CPU": 2, "library_pool": 2, "object_store_memory": 150 * MB}, "max_workers": 1},
}


@pytest.fixture
def cluster(monkeypatch):
    """The autoscaling cluster (its own processes and temp dir), and this process connected to it
    (to watch its nodes)."""
    types = {name: {**spec, "node_config": {}, "min_workers": 0} for name, spec in NODE_TYPES.items()}
    autoscaling = LocalAutoscalingCluster(
        head_resources={"CPU": 1, "object_store_memory": 200 * MB}, worker_node_types=types, idle_timeout_minutes=0.1
    )
    autoscaling.start()
    try:
        # "auto" finds this cluster's address file in its own temp dir and, like `ray start` for the
        # cluster, turns on token auth when this machine holds ~/.ray/auth_token (for this process and
        # the `slea train` and `slea scale` it starts); an explicit address would not.
        monkeypatch.setenv("RAY_TMPDIR", autoscaling.ray.roots[-1])
        ray.init(address="auto", log_to_driver=False)
        yield autoscaling
    finally:
        ray.shutdown()
        autoscaling.shutdown()


def actor_nodes() -> dict[str, bool]:
    """Node id -> alive, for every node of the actor type the cluster has had."""
    return {node["NodeID"]: node["Alive"] for node in ray.nodes() if "actor_pool" in node["Resources"]}


def actor_node_launches(session_dir: Path, since: float) -> list[float]:
    """When the autoscaler began to launch actor nodes (epoch seconds), from `since` on, read from its
    monitor.log: a launcher logs "Got N nodes to launch" as it starts the node's processes and, once
    they run, "Launching N nodes, type T" (the first line does not name the type)."""
    log = session_dir / "logs" / "monitor.log"
    if not log.exists():
        return []
    began: dict[str, float] = {}  # launcher -> its latest "Got" line
    launches = []
    for line in log.read_text(errors="replace").splitlines():
        found = re.match(
            r"(\S+ \S+),(\d+)\s+INFO node_launcher\.py:\d+ -- (\S+): (Got|Launching) .*?(ray\.\w+)?\.$", line
        )
        if found is None:
            continue
        at = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(found[2]) / 1000
        if found[4] == "Got":
            began[found[3]] = at
        elif found[5] == "ray.actor" and found[3] in began:
            launches.append(began[found[3]])
    return [at for at in launches if at >= since]


def alive_actor_nodes() -> int:
    return sum(actor_nodes().values())


class StreamTap(threading.Thread):
    """Keeps a copy of every stream entry (the driver trims what both groups acknowledged) and notes
    the episodes each watched worker lists in flight, the moment they are listed. An error ends the
    tap and is kept in `error`: wait_until fails on it at once, naming it."""

    def __init__(self, url: str, stream: str, run_id: str):
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.stream, self.run_id = stream, run_id
        self.records: dict[str, object] = {}  # entry id -> StepRecord
        self.listed: dict[int, set[str]] = {}  # worker index -> episode ids it listed in flight
        self.lock = threading.Lock()  # the test reads while the tap writes
        self.done = threading.Event()
        self.error: BaseException | None = None

    def watch(self, *workers: int) -> None:
        for worker in workers:
            self.listed.setdefault(worker, set())

    def run(self) -> None:
        try:
            self._tap()
        except BaseException as exc:  # kept for the test's thread to raise
            self.error = exc

    def _tap(self) -> None:
        last = "0-0"
        while not self.done.is_set():
            listed = {worker: self.client.hkeys(inflight_key(self.run_id, worker)) for worker in self.listed}
            read = self.client.xread({self.stream: last}, count=1000, block=50) or []
            with self.lock:
                for worker, keys in listed.items():
                    self.listed[worker].update(key.decode() for key in keys)
                for _stream, entries in read:
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        self.records[last] = decode(fields[PAYLOAD_FIELD])

    def first_streamed_ms(self, worker: int) -> int | None:
        """Redis time (ms, from the entry id) of the first step of an episode the worker listed."""
        with self.lock:
            episodes = self.listed.get(worker, set())
            times = [
                int(entry_id.split("-")[0])
                for entry_id, record in self.records.items()
                if record.episode_id in episodes and not record.abandoned
            ]
        return min(times) if times else None

    def group_ids(self, *workers: int) -> set[str]:
        """The groups of the episodes these workers listed, abandoned steps left out."""
        with self.lock:
            episodes = set().union(*(self.listed.get(worker, set()) for worker in workers))
            return {
                record.group_id
                for record in self.records.values()
                if record.episode_id in episodes and not record.abandoned
            }


def wait_until(predicate, what: str, timeout_s: float, driver: subprocess.Popen, log_path, tap: StreamTap) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tap.error is not None:
            raise AssertionError(f"the stream tap failed waiting for {what}: {tap.error!r}") from tap.error
        if predicate():
            return
        if driver.poll() is not None:
            raise AssertionError(f"slea train exited ({driver.returncode}) waiting for {what}:\n{log_tail(log_path)}")
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{log_tail(log_path)}")


def log_tail(path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def slea_scale(run_dir, workers: int) -> str:
    result = subprocess.run(
        [*SLEA, "scale", str(run_dir), "--actors", str(workers)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def trained_trace(run_dir) -> list[dict]:
    trace = run_dir / "learner" / "trained_groups.jsonl"
    return [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []


def trained_steps(run_dir) -> int:
    return len(trained_trace(run_dir))


def trained_group_ids(run_dir) -> set[str]:
    return {group_id for line in trained_trace(run_dir) for group_id in line["group_ids"]}


def test_slea_scale_grows_and_shrinks_the_pool_across_autoscaled_nodes(cluster, tmp_path, tiny_model_dir, redis_url):
    address, run_id = cluster.ray.address, "multinode"
    run_dir, log_path = tmp_path / run_id, tmp_path / "train.log"
    settings = [
        *tiny_run(tmp_path, run_id, tiny_model_dir),
        f"redis.url={redis_url}",
        f"ray.address={address}",
        "actors.num_workers=1",
        "actors.max_staleness=1000",  # every group is trained or abandoned: the audit counts no stale drops
        "actors.resources={actor_pool: 1}",
        "learner.tasks_per_step=1",
        "learner.num_cpus=1",
        "learner.max_steps=100000",
        "learner.max_staleness=1000",
        "learner.resources={learner_pool: 1}",
        "library.resources={library_pool: 1}",
        "library.http_port=0",
        "eval.every=0",
        "monitoring.sinks=[jsonl]",
        "monitoring.plots=false",
    ]
    stream = f"slea:{run_id}:steps"
    tap = StreamTap(redis_url, stream, run_id)
    tap.watch(1, 2)  # the workers 1 -> 3 adds
    tap.start()
    with log_path.open("w") as log:
        driver = subprocess.Popen(
            [*SLEA, "train", "configs/local.yaml", *[arg for setting in settings for arg in ("--set", setting)]],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: trained_steps(run_dir) >= 2, "the first learner steps", 240, driver, log_path, tap)
        assert alive_actor_nodes() == 1, actor_nodes()  # the autoscaler started one node for the one worker

        # 1 -> 3: two workers wait for actor_pool, the autoscaler starts two nodes, both stream groups.
        nodes_before = set(actor_nodes())
        asked_at = time.time()
        assert "actor workers 1 -> 3" in slea_scale(run_dir, 3)
        node_seen: dict[str, float] = {}

        def grown() -> bool:
            for node_id, alive in actor_nodes().items():
                if alive and node_id not in nodes_before:
                    node_seen.setdefault(node_id, time.time())
            return len(node_seen) == 2 and all(tap.first_streamed_ms(worker) for worker in (1, 2))

        wait_until(grown, "two new actor nodes and their workers' first groups", 180, driver, log_path, tap)
        first_s = min(tap.first_streamed_ms(worker) for worker in (1, 2)) / 1000
        registered = sorted(node_seen.values())
        launched = actor_node_launches(cluster.ray.session_dir, since=asked_at)
        launch = f"{launched[0] - asked_at:.1f} s" if launched else "(no monitor.log)"
        print(
            f"\n1 -> 3: the autoscaler began to launch the first new actor node {launch} after slea scale started; new "
            f"nodes registered after {registered[0] - asked_at:.1f} s and {registered[1] - asked_at:.1f} s; the first "
            f"group of a new worker streamed after {first_s - asked_at:.1f} s: {first_s - launched[0] if launched else float('nan'):.1f} s "
            f"from the node's launch, {first_s - registered[0]:.1f} s from its registration"
        )
        # A new worker's first group is trained before 3 -> 1: scaling down abandons what is in flight.
        wait_until(
            lambda: tap.group_ids(1, 2) & trained_group_ids(run_dir),
            "a group of a new worker to be trained",
            180,
            driver,
            log_path,
            tap,
        )
        steps_at_three = trained_steps(run_dir)

        # 3 -> 1: the removed workers stop, their nodes go idle and the autoscaler removes them.
        asked_at = time.time()
        assert "actor workers 3 -> 1" in slea_scale(run_dir, 1)
        wait_until(
            lambda: alive_actor_nodes() == 1,
            "the autoscaler to remove the idle actor nodes",
            120,
            driver,
            log_path,
            tap,
        )
        print(f"3 -> 1: idle actor nodes removed {time.time() - asked_at:.1f} s after slea scale")
        wait_until(
            lambda: trained_steps(run_dir) >= steps_at_three + 2,
            "learner steps after 3 -> 1",
            120,
            driver,
            log_path,
            tap,
        )
        assert "actor pool: 1 -> 3 workers (slea scale)" in log_path.read_text()
    finally:
        driver.send_signal(signal.SIGINT)  # a graceful stop: actors abandon, the learner checkpoints
        try:
            driver.wait(timeout=180)
        finally:
            if driver.poll() is None:
                driver.kill()
            tap.done.set()
            tap.join(timeout=10)
    assert tap.error is None, f"the stream tap failed, the audit would miss entries: {tap.error!r}"
    assert driver.returncode == 130, log_tail(log_path)
    assert not (run_dir / "driver.json").exists()  # `slea scale` now says the run is not going

    client = redis.Redis.from_url(redis_url)
    audit = audit_the_stream(tap.records, client, stream, run_dir / "learner", group_size=2)
    assert lineage(audit.trace) == audit.trace, "a learner step was rolled back: the learner restarted"
    versions = [line["policy_version"] for line in audit.trace]
    assert versions == list(range(versions[0], versions[0] + len(versions)))  # continuous, no repeat
    assert tap.group_ids(1, 2) & audit.trained, "no group of a worker added by slea scale was trained on"
