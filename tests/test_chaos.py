"""Chaos (issue 22, item 2): `slea train` on a Ray cluster and a Redis of the test's own, bounded by
run.max_seconds, while a seeded loop kills one component every 12-15 s: an actor worker, the
learner, the library writer, a Serve replica (SIGKILL each), and Redis (restarted on its AOF).
Each kind goes once, in a seeded order, then more at random while the chaos window lasts.

The run reaches its end with no manual action (exit 0), and the stream audit (tests/helpers.py)
shows every finished episode trained at most once and never an abandoned one, nothing
acknowledged without its effect, the surviving version line without gap or repeat; the library's
last restart lost none of its items (every item of the snapshot it resumed from is in the final
one, unless the library itself evicted or pruned it). It prints the faults survived and the time
from each to the next trained step.

Only the test's own processes are killed (tests/helpers.py TaggedRay); never `ray stop`.
"""

import random
import signal
import time
from dataclasses import dataclass

import pytest
from helpers import audit_the_stream, broken_run, output_tail, start_train, trained_trace

from library.persistence import latest_snapshot, parse_snapshot
from slea.config import load_config
from slea.embedded_redis import EmbeddedRedis
from slea.records import decode
from slea.redis_conn import connect
from slea.streams import PAYLOAD_FIELD

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)

SEED = 22
FAULT_EVERY_S = (12.0, 15.0)  # five kinds within CHAOS_S; a fault may come while the last one heals
CHAOS_S = 80.0  # faults are injected this long after the first trained step
MAX_SECONDS = 150.0  # run.max_seconds: the learner stops some 50 s after the window (a learner rebuild takes ~40 s)
RUN_LIMIT_S = 420.0  # a hang guard for the whole `slea train` (about 250 s on an idle 2-core machine)
KILLED = {  # fault kind -> the title prefix of the Ray worker process it kills
    "actor worker": "ray::ActorWorker",
    "learner": "ray::LearnerProcess",
    "library writer": "ray::LibraryProcess",
    "Serve replica": "ray::ServeReplica",
}
KINDS = [*KILLED, "Redis"]


@dataclass
class Fault:
    kind: str
    at: float  # monotonic time it was injected
    steps_before: int  # trained steps (trace lines) when it was injected
    recovered_s: float | None = None  # time to the next trained step


def inject(kind: str, cluster, server: EmbeddedRedis, rng: random.Random) -> bool:
    """One fault of `kind`; False when there is nothing of that kind to kill right now (it is
    being restarted)."""
    if kind == "Redis":
        server.restart()  # SIGTERM flushes the AOF; the same port and data come back
        return True
    processes = cluster.processes(KILLED[kind])
    if not processes:
        return False
    rng.choice(processes).send_signal(signal.SIGKILL)
    return True


def snapshot_items(path) -> tuple[int, set[str], dict]:
    """(version, item ids, counters) of a library snapshot file."""
    header, _clusters, experiences = parse_snapshot(path.read_text())
    return header["version"], {item["id"] for item in experiences}, header["counters"]


def test_a_run_heals_itself_from_repeated_faults_of_every_kind(
    cluster, redis_server, redis_url, tmp_path, tiny_model_dir
):
    run_dir = tmp_path / "chaos"
    settings = [
        *broken_run(
            tmp_path,
            "chaos",
            tiny_model_dir,
            redis_url,
            cluster.start_head("--num-cpus=4", "--include-dashboard=false"),
        ),
        "run.max_failures=100",
        f"run.max_seconds={MAX_SECONDS}",
        "learner.max_steps=100000",
        "learner.checkpoint_every=2",
    ]
    config = load_config("configs/local.yaml", settings)
    stream = config.stream_key()
    client = connect(config.redis, redis_url)
    log = tmp_path / "train.log"
    started = time.monotonic()
    driver = start_train(cluster, settings, log)
    rng = random.Random(SEED)
    order = rng.sample(KINDS, len(KINDS))  # every kind once, then at random
    faults: list[Fault] = []
    resumed_from = None  # (version, ids, counters) of the snapshot the last library restart resumed from
    try:
        # An audit group that never reads keeps the whole stream for the counts (the driver trims
        # only what every group acknowledged); made as soon as the driver has made the stream.
        while not client.exists(stream):
            assert driver.poll() is None, f"slea train exited early ({driver.returncode}):\n{output_tail(log)}"
            assert time.monotonic() - started < 120, f"no stream {stream} in 120 s:\n{output_tail(log)}"
            time.sleep(0.05)
        client.xgroup_create(stream, "audit", id="0")
        while not trained_trace(run_dir):
            assert driver.poll() is None, f"slea train exited early ({driver.returncode}):\n{output_tail(log)}"
            assert time.monotonic() - started < 180, f"no trained step in 180 s:\n{output_tail(log)}"
            time.sleep(0.2)
        chaos_ends = time.monotonic() + CHAOS_S
        next_fault = time.monotonic() + rng.uniform(*FAULT_EVERY_S)
        while driver.poll() is None:
            assert time.monotonic() - started < RUN_LIMIT_S, f"slea train still running:\n{output_tail(log)}"
            steps = len(trained_trace(run_dir))
            for fault in faults:
                if fault.recovered_s is None and steps > fault.steps_before:
                    fault.recovered_s = time.monotonic() - fault.at
            if time.monotonic() >= next_fault and time.monotonic() < chaos_ends:
                kind = order.pop(0) if order else rng.choice(KINDS)
                if kind == "library writer" and latest_snapshot(run_dir) is not None:
                    resumed_from = snapshot_items(latest_snapshot(run_dir))
                if inject(kind, cluster, redis_server, rng):
                    faults.append(Fault(kind, time.monotonic(), steps))
                    next_fault = time.monotonic() + rng.uniform(*FAULT_EVERY_S)
                else:
                    order.append(kind)  # being restarted: its turn comes again
            time.sleep(0.2)
        output = log.read_text(errors="replace")
        assert driver.returncode == 0, f"slea train exited {driver.returncode}:\n{output_tail(log)}"

        lines = [f"{len(faults)} faults survived in {time.monotonic() - started:.0f} s:"]
        lines += [
            f"  {fault.kind:15s} next trained step after "
            + ("(none)" if fault.recovered_s is None else f"{fault.recovered_s:.1f} s")
            for fault in faults
        ]
        print("\n".join(lines))
        assert {fault.kind for fault in faults} == set(KINDS), f"not every kind was injected: {lines}"
        assert all(fault.recovered_s is not None for fault in faults), "\n".join(lines) + "\n" + output[-3000:]
        assert "run.max_seconds" in output, "the run ended before its time limit"

        records = {entry_id.decode(): decode(fields[PAYLOAD_FIELD]) for entry_id, fields in client.xrange(stream)}
        audit = audit_the_stream(records, client, stream, run_dir / "learner", config.actors.group_size)
        assert len(audit.trained) >= len(faults), "training hardly went on between the faults"

        # The library's last restart resumed from its newest snapshot and lost none of it.
        assert resumed_from is not None, "the library writer was killed before its first snapshot"
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
