"""Chaos (issues 22 and 36): `slea train` on a Ray cluster and a Redis of the test's own, bounded by
run.max_seconds, while a seeded loop breaks one thing every 12-15 s: an actor worker, the learner,
the library writer, a Serve replica (SIGKILL each), and Redis (SIGKILL, its AOF cut back to its size
two seconds before: what `appendfsync everysec` may lose when the machine under Redis crashes; down
3 s, past redis-py's own retries). Each kind once in a seeded order, then more at random while the
chaos window lasts. What each fault leaves behind in the stream (episodes cut short and dropped as
abandoned, lost updates trained again) is also checked after a whole cluster's loss
(tests/test_cluster_resume.py); that a retrieval that fails or times out is counted as a miss and
the step goes on without experiences, in tests/actors/test_retrieval_client.py.

Healing is shown fault by fault, not by the run's end alone: the driver says the restart (its line
for that component) and counts it (slea_run_component_restarts_total on its metrics port), and the
component's own work comes back:
- learner: a step trained after its restart;
- library writer: a library version committed (a snapshot of a newer version) after its restart;
- Serve replica: Serve starts another (the driver says the deployment is healthy again, the killed
  process is gone) and it answers /retrieve over HTTP;
- actor worker: its replacement lists new episodes in flight and their steps reach the stream;
- Redis: the run trains on; each entry its crash lost is accounted for: its group trained (the
  learner had read it), abandoned, dropped and counted by the learner, or still waiting; nothing
  is trained twice (the audit).

Trimming stays on: the test holds no consumer group. It reads every entry as it is written (XRANGE
from a cursor, which takes nothing from the run), checks that it saw every entry Redis counted
(XINFO STREAM entries-added), audits those records (tests/helpers.py), and checks that the stream
was trimmed while the faults came. It prints each fault with its restart and recovery times.

Only the test's own processes are killed (tests/helpers.py TaggedRay); never `ray stop`.
"""

import json
import os
import random
import re
import signal
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from helpers import (
    audit_the_stream,
    broken_run,
    entry_key,
    learner_metrics,
    output_tail,
    start_train,
    trained_steps,
    trained_trace,
)
from prometheus_client.parser import text_string_to_metric_families

from library.persistence import latest_snapshot, parse_snapshot
from slea.channels import inflight_key, inflight_pattern
from slea.config import load_config
from slea.embedded_redis import EmbeddedRedis
from slea.ports import free_port
from slea.records import StepRecord, decode
from slea.streams import PAYLOAD_FIELD

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)

SEED = 36
FAULT_EVERY_S = (12.0, 15.0)  # five kinds within CHAOS_S; a fault may come while the last one heals
CHAOS_S = 80.0  # faults are injected this long after the first trained step
MAX_SECONDS = 170.0  # run.max_seconds: the last fault has some 60 s to heal (a learner rebuild takes ~40 s)
RUN_LIMIT_S = 480.0  # a hang guard for the whole `slea train` (about 270 s on an idle 2-core machine)
# appendfsync everysec: a machine's crash loses up to this much of the AOF (redis.conf: a slow fsync
# in progress postpones the next write for up to 2 s)
REDIS_FSYNC_S = 2.0
# Redis stays down this long before it is started again: longer than redis-py's own few quick
# retries, so the components' reconnect logic (redis.reconnect_max_s) must carry the outage.
REDIS_OUTAGE_S = 3.0
STUCK_S = 60.0  # at the end, no entry pending under the learner this long (group_timeout_s 30 + claim_idle_ms 10 s)
KILLED = {  # fault kind -> the title prefix of the Ray worker process it kills
    "actor worker": "ray::ActorWorkerProcess",
    "learner": "ray::LearnerProcess",
    "library writer": "ray::LibraryProcess",
    "Serve replica": "ray::ServeReplica",
}
KINDS = [*KILLED, "Redis"]
COMPONENT = {  # fault kind -> its label in slea_run_component_restarts_total
    "actor worker": "actor_worker",
    "learner": "learner",
    "library writer": "library_writer",
    "Serve replica": "serve_replica",
}
RESTART_LINE = {  # fault kind -> the driver's line when the component is restarted
    "actor worker": re.compile(r"actor worker (\d+) restarted \(Ray restarted its process"),
    "learner": re.compile(r"learner died \("),
    "library writer": re.compile(r"library writer died \("),
    "Serve replica": re.compile(r"a Serve replica of \S+ failed"),
}
SERVE_HEALTHY_LINE = re.compile(r"is healthy again: Serve replaced its failed replica")


@dataclass
class Fault:
    kind: str
    at: float  # monotonic time it was injected
    restart_lines_before: int  # the driver's restart lines for this kind when it was injected
    known_episodes: set[str] = field(default_factory=set)  # actor worker: episodes in flight when it was killed
    killed_pid: int | None = None
    snapshot_version: int = -1  # library writer: the newest snapshot's version when it was killed
    restarted_at: float | None = None  # the driver's restart line (Redis: back up, restarted by the test)
    trained_at_restart: int = 0  # trained steps when it restarted
    worker: int | None = None  # actor worker: the index the driver named
    new_episodes: set[str] = field(default_factory=set)  # actor worker: its replacement's episodes
    healthy_at: float | None = None  # Serve replica: the driver's "healthy again" line
    resumed_at: float | None = None  # the component's own work seen again
    lost: set[str] = field(default_factory=set)  # Redis: entries the crash lost

    def timing(self) -> str:
        def since(moment: float | None) -> str:
            return "never" if moment is None else f"{moment - self.at:5.1f} s"

        extra = f" ({len(self.lost)} entries lost)" if self.kind == "Redis" else ""
        return f"  {self.kind:15s} restarted after {since(self.restarted_at)}, working after {since(self.resumed_at)}{extra}"


class RunObserver:
    """What the test reads while the run goes, none of it taken from the run: the driver's output
    lines, every stream entry (XRANGE from a cursor), the driver's restart counters (its metrics
    port), the stream's first entry (trimming), and the AOF's size (for the crash)."""

    def __init__(self, log: Path, client: redis.Redis, stream: str, metrics_port: int, aof_dir: Path):
        self.log, self.client, self.stream = log, client, stream
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.aof_dir = aof_dir
        self.lines: list[tuple[float, str]] = []  # (monotonic time read, line)
        self.records: dict[str, StepRecord] = {}  # entry id -> record, every entry the stream held
        self.restarts: dict[str, float] = {}  # component label -> the driver's counter at the last scrape
        self.first_entries: list[tuple[float, str]] = []  # (time, the stream's first entry id)
        self.aof_sizes: deque[tuple[float, Path, int]] = deque(maxlen=100)  # (time, incr file, size)
        self._log_offset = 0
        self._partial = ""
        self._cursor: str | None = None
        self._scraped_at = -float("inf")

    def tick(self) -> None:
        now = time.monotonic()
        self._read_log(now)
        self._read_aof_size(now)
        try:
            self._read_stream(now)
        except (redis.ConnectionError, redis.BusyLoadingError):
            pass  # Redis restarting: read on from the cursor once it is back
        if now - self._scraped_at >= 1.0:
            self._scraped_at = now
            self._scrape()

    def _read_log(self, now: float) -> None:
        with self.log.open("rb") as out:
            out.seek(self._log_offset)
            chunk = out.read().decode(errors="replace")
            self._log_offset = out.tell()
        *complete, self._partial = (self._partial + chunk).split("\n")
        self.lines += [(now, line) for line in complete]

    def _read_stream(self, now: float) -> None:
        while True:
            low = "-" if self._cursor is None else f"({self._cursor}"
            entries = self.client.xrange(self.stream, min=low, max="+", count=1000)
            for entry_id, fields in entries:
                self.records[entry_id.decode()] = decode(fields[PAYLOAD_FIELD])
                self._cursor = entry_id.decode()
            if len(entries) < 1000:
                break
        first = self.client.xrange(self.stream, count=1)
        if first:
            self.first_entries.append((now, first[0][0].decode()))

    def _read_aof_size(self, now: float) -> None:
        increments = sorted(self.aof_dir.glob("*.incr.aof"), key=lambda path: int(path.name.split(".")[-3]))
        if increments:
            self.aof_sizes.append((now, increments[-1], increments[-1].stat().st_size))

    def _scrape(self) -> None:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return  # the driver not listening yet, or gone
        for family in text_string_to_metric_families(text):
            if family.name == "slea_run_component_restarts":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        self.restarts[sample.labels["component"]] = sample.value

    def count(self, pattern: re.Pattern) -> int:
        return sum(bool(pattern.search(line)) for _, line in self.lines)

    def lines_after(self, pattern: re.Pattern, moment: float) -> list[re.Match]:
        return [match for at, line in self.lines if at >= moment and (match := pattern.search(line))]

    def size_before(self, moment: float) -> tuple[Path, int] | None:
        """The AOF increment file and its size at `moment` (the newest reading before it)."""
        earlier = [(path, size) for at, path, size in self.aof_sizes if at <= moment]
        return earlier[-1] if earlier else None


def crash_redis(server: EmbeddedRedis, observer: RunObserver) -> set[str]:
    """SIGKILL Redis, cut its AOF back to its size REDIS_FSYNC_S ago (the writes an OS crash takes
    with it under everysec; redis-server loads a cut tail, aof-load-truncated), start it again on
    the same port and data REDIS_OUTAGE_S later; returns the entries it had accepted and no longer
    holds."""
    crashed_at = time.monotonic()
    crash_ms = int(time.time() * 1000)
    server.process.kill()
    server.process.wait()
    server.process = None
    synced = observer.size_before(crashed_at - REDIS_FSYNC_S)
    current = observer.size_before(crashed_at)
    if synced is not None and current is not None and synced[0] == current[0]:  # no AOF rewrite in between
        os.truncate(synced[0], synced[1])
    time.sleep(REDIS_OUTAGE_S)
    server.start()
    since = f"{crash_ms - 5000}-0"  # before the cut: what was trimmed by now is older than this
    held = {entry_id.decode() for entry_id, _ in observer.client.xrange(observer.stream, min=since)}
    return {
        entry_id
        for entry_id in observer.records
        if entry_key(entry_id) >= entry_key(since) and entry_key(entry_id) <= (crash_ms, 2**64) and entry_id not in held
    }


def snapshot_items(path) -> tuple[int, set[str], dict]:
    """(version, item ids, counters) of a library snapshot file."""
    header, _clusters, experiences = parse_snapshot(path.read_text())
    return header["version"], {item["id"] for item in experiences}, header["counters"]


def snapshot_version(run_dir: Path) -> int:
    path = latest_snapshot(run_dir)
    return -1 if path is None else snapshot_items(path)[0]


def retrieve(http_port: int, record: StepRecord) -> dict:
    """One /retrieve over Serve's HTTP proxy, as a client outside Ray asks."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/retrieve",
        data=json.dumps({"observation": record.anchor_obs, "task_type": record.task_type}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def inflight_episodes(client: redis.Redis, run_id: str, worker: int | None = None) -> set[str]:
    """The episodes listed in flight, by every worker or by one (actors/inflight.py)."""
    pattern = inflight_pattern(run_id) if worker is None else inflight_key(run_id, worker)
    return {episode.decode() for key in client.scan_iter(match=pattern) for episode in client.hkeys(key)}


def follow(fault: Fault, observer: RunObserver, run_dir: Path, run_id: str, http_port: int, cluster) -> None:
    """Move `fault` on: its restart seen, then its component's own work."""
    now = time.monotonic()
    trained = len(trained_steps(run_dir))
    if fault.restarted_at is None:
        if fault.kind == "Redis":
            fault.restarted_at = fault.at  # the test restarted it
        elif observer.count(RESTART_LINE[fault.kind]) > fault.restart_lines_before:
            fault.restarted_at = now
            match = observer.lines_after(RESTART_LINE[fault.kind], fault.at)
            if fault.kind == "actor worker" and match:
                fault.worker = int(match[0].group(1))
        fault.trained_at_restart = trained
        return
    if fault.resumed_at is not None:
        return
    try:
        if fault.kind in ("learner", "Redis"):
            resumed = trained > fault.trained_at_restart
        elif fault.kind == "library writer":
            resumed = snapshot_version(run_dir) > fault.snapshot_version
        elif fault.kind == "actor worker":
            fault.new_episodes |= inflight_episodes(observer.client, run_id, fault.worker) - fault.known_episodes
            resumed = any(
                record.episode_id in fault.new_episodes and record.step >= 0 for record in observer.records.values()
            )
        else:  # Serve replica: healthy again, the killed process gone, and the replacement answers
            if fault.healthy_at is None and observer.lines_after(SERVE_HEALTHY_LINE, fault.restarted_at):
                fault.healthy_at = now
            alive = {process.pid for process in cluster.processes(KILLED["Serve replica"])}
            resumed = (
                fault.healthy_at is not None
                and fault.killed_pid not in alive
                and bool(alive)
                and "experiences" in retrieve(http_port, next(iter(observer.records.values())))
            )
    except (redis.ConnectionError, redis.BusyLoadingError, OSError):
        resumed = False  # Redis or the proxy restarting: asked again at the next tick
    if resumed:
        fault.resumed_at = now


def dropped_groups(lines: list[dict]) -> int:
    """Groups the learner dropped as incomplete or lost over the run: its counters start again at 0
    with each learner process, so each fall is a new process."""
    total = previous = 0
    for line in lines:
        value = line["groups_dropped_incomplete"] + line["groups_dropped_lost"]
        total += value - previous if value >= previous else value
        previous = value
    return total


def test_a_run_heals_itself_from_repeated_faults_of_every_kind(cluster, tmp_path, tiny_model_dir):
    run_dir = tmp_path / "chaos"
    server = EmbeddedRedis(tmp_path / "redis", appendonly=True).start()
    metrics_port, http_port = free_port(), free_port()
    settings = [
        *broken_run(
            tmp_path,
            "chaos",
            tiny_model_dir,
            server.url,
            cluster.start_head("--num-cpus=4", "--include-dashboard=false"),
        ),
        "run.max_failures=100",
        f"run.max_seconds={MAX_SECONDS}",
        "learner.max_steps=100000",
        "learner.checkpoint_every=2",
        # A group that lost a step with Redis's last second can never complete: it waits this long,
        # holding its entries pending (and the stream untrimmed), then is dropped and counted. The
        # default (600 s) outlasts this run; a group of 2 three-step episodes completes in seconds.
        "learner.group_timeout_s=30",
        # Entries whose XACK the crash undid are handed to the learner again once idle this long
        # (StreamConsumer.reclaim_forgotten; 60 s by default, near the end of this run).
        "redis.claim_idle_ms=10000",
        f"monitoring.metrics_port={metrics_port}",
        f"library.http_port={http_port}",
    ]
    config = load_config("configs/local.yaml", settings)
    stream, run_id = config.stream_key(), config.run.id
    client = redis.Redis.from_url(server.url, socket_timeout=10)
    log = tmp_path / "train.log"
    log.touch()
    observer = RunObserver(log, client, stream, metrics_port, server.data_dir / "appendonlydir")
    started = time.monotonic()
    driver = start_train(cluster, settings, log)
    rng = random.Random(SEED)
    order = rng.sample(KINDS, len(KINDS))  # every kind once, then at random
    faults: list[Fault] = []
    resumed_from = None  # (version, ids, counters) of the snapshot the last library restart resumed from
    try:
        while not trained_trace(run_dir):
            assert driver.poll() is None, f"slea train exited early ({driver.returncode}):\n{output_tail(log)}"
            assert time.monotonic() - started < 180, f"no trained step in 180 s:\n{output_tail(log)}"
            observer.tick()
            time.sleep(0.2)
        chaos_ends = time.monotonic() + CHAOS_S
        next_fault = time.monotonic() + rng.uniform(*FAULT_EVERY_S)
        while driver.poll() is None:
            assert time.monotonic() - started < RUN_LIMIT_S, f"slea train still running:\n{output_tail(log)}"
            observer.tick()
            for fault in faults:
                follow(fault, observer, run_dir, run_id, http_port, cluster)
            if time.monotonic() >= next_fault and time.monotonic() < chaos_ends:
                kind = order.pop(0) if order else rng.choice(KINDS)
                fault = Fault(kind, time.monotonic(), observer.count(RESTART_LINE[kind]) if kind in RESTART_LINE else 0)
                processes = cluster.processes(KILLED[kind]) if kind in KILLED else []
                # Its turn comes again when there is nothing to kill (being restarted), or, for the
                # writer, nothing to lose yet (no snapshot: the check at the end needs one).
                if (kind in KILLED and not processes) or (
                    kind == "library writer" and latest_snapshot(run_dir) is None
                ):
                    order.append(kind)
                else:
                    if kind == "Redis":
                        fault.lost = crash_redis(server, observer)
                    else:
                        if kind == "library writer":
                            resumed_from = snapshot_items(latest_snapshot(run_dir))
                        fault.snapshot_version = snapshot_version(run_dir)
                        fault.known_episodes = inflight_episodes(client, run_id)
                        victim = rng.choice(processes)
                        fault.killed_pid = victim.pid
                        victim.send_signal(signal.SIGKILL)
                    faults.append(fault)
                    next_fault = time.monotonic() + rng.uniform(*FAULT_EVERY_S)
            time.sleep(0.2)
        observer.tick()
        output = log.read_text(errors="replace")
        assert driver.returncode == 0, f"slea train exited {driver.returncode}:\n{output_tail(log)}"

        lines = [f"{len(faults)} faults survived in {time.monotonic() - started:.0f} s:"]
        lines += [fault.timing() for fault in faults]
        report = "\n".join(lines)
        print(report)
        assert {fault.kind for fault in faults} == set(KINDS), f"not every kind was injected:\n{report}"
        assert all(fault.restarted_at is not None for fault in faults), (
            f"a restart not seen:\n{report}\n{output[-3000:]}"
        )
        assert all(fault.resumed_at is not None for fault in faults), f"work not resumed:\n{report}\n{output[-3000:]}"
        assert "run.max_seconds" in output, "the run ended before its time limit"
        for kind, label in COMPONENT.items():  # the driver counted every restart it said
            assert observer.restarts.get(label, 0) >= sum(fault.kind == kind for fault in faults), (
                kind,
                observer.restarts,
            )

        # Every entry Redis took was read here (nothing trimmed unseen): no group of the test's
        # holds trimming back.
        lost = frozenset().union(*(fault.lost for fault in faults))
        assert client.xinfo_stream(stream)["entries-added"] == len(observer.records) - len(lost)
        # Trimmed while the faults came: the stream's first entry moved on after the first fault, and
        # the stream holds at the end less than half of what was written.
        first_at_fault = [entry_id for at, entry_id in observer.first_entries if at <= faults[0].at][-1]
        firsts_after = {entry_id for at, entry_id in observer.first_entries if at > faults[0].at}
        held = client.xlen(stream)
        groups = [(g["name"], g["last-delivered-id"], g["pending"]) for g in client.xinfo_groups(stream)]
        assert any(entry_key(entry_id) > entry_key(first_at_fault) for entry_id in firsts_after), (
            "not trimmed",
            groups,
        )
        stuck = [
            (
                entry["message_id"].decode(),
                entry["consumer"].decode(),
                entry["time_since_delivered"],
                entry["times_delivered"],
                observer.records[entry["message_id"].decode()].group_id,
                observer.records[entry["message_id"].decode()].episode_id[-6:],
                observer.records[entry["message_id"].decode()].step,
            )
            for entry in client.xpending_range(stream, "learner", "-", "+", 20)
        ]
        assert all(row[2] < STUCK_S * 1000 for row in stuck), (
            "entries pending under the learner that nothing will ever acknowledge (id, consumer, idle ms, "
            "deliveries, group, episode, step):\n" + "\n".join(map(str, stuck))
        )
        assert held < len(observer.records) / 2, (
            f"{held} of {len(observer.records)} entries still held; groups {groups}; the learner's oldest "
            f"pending (id, consumer, idle ms, deliveries, group, episode, step):\n"
            + "\n".join(map(str, stuck))
            + f"\n{report}"
        )

        audit = audit_the_stream(observer.records, client, stream, run_dir / "learner", config.actors.group_size, lost)
        assert len(audit.trained) >= len(faults), "training hardly went on between the faults"
        # Redis's lost last second: each group it cut is trained, abandoned, dropped and counted by the
        # learner, or still waiting for its missing steps; never silently gone.
        lost_groups = {observer.records[entry_id].group_id for entry_id in lost}
        held = {entry_id.decode() for entry_id, _ in client.xrange(stream)}
        waiting = {observer.records[entry_id].group_id for entry_id in held}
        unaccounted = lost_groups - audit.trained - audit.abandoned - waiting
        assert len(unaccounted) <= dropped_groups(learner_metrics(run_dir)), (unaccounted, report)

        # The library's last restart resumed from its newest snapshot and lost none of it.
        assert resumed_from is not None, "the library writer was never killed"
        version, ids, counters = resumed_from
        final_version, final_ids, final_counters = snapshot_items(latest_snapshot(run_dir))
        removed = sum(final_counters.get(name, 0) - counters.get(name, 0) for name in ("evicted", "pruned"))
        assert final_version >= version and len(ids - final_ids) <= removed, (
            f"items lost across the library's restart: {sorted(ids - final_ids)} ({removed} evicted or pruned)"
        )
    finally:
        client.close()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        server.stop()
