"""A run outlives its whole Ray cluster (issue 13, item 4): `slea train` on a Ray head started as a
process of its own and an external Redis (AOF on) trains a few steps with checkpoints and library
snapshots; then the driver and every process of the cluster are SIGKILLed (the learner, the
library writer, Serve, the actors and the weight registry all go at once, nothing gets to shut
down). On a new cluster `slea train --resume RUN_DIR` continues: the learner from its
checkpoint, the library from its snapshot, the version line continuous (no number given twice,
none skipped), nothing trained twice, the rolled-back updates redone from the re-read entries.

Only the processes of the test's own cluster are killed (tests/helpers.py TaggedRay): a Ray of
the user's, or a benchmark beside the suite, goes on.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    TaggedRay,
    broken_run,
    check_a_broken_run,
    lineage,
    output_tail,
    start_train,
    trained_trace,
)

from library.persistence import latest_snapshot, parse_snapshot
from slea.channels import inflight_key, policy_version_key
from slea.config import load_config
from slea.records import decode
from slea.streams import PAYLOAD_FIELD

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)
SLEA = [sys.executable, "-m", "driver.cli"]
CHECKPOINT_EVERY = 3  # the cluster goes between two checkpoints: a step or two are lost and redone


def start_cluster(cluster: TaggedRay) -> str:
    """A local Ray cluster as its own processes (`ray start --head`), outliving any driver."""
    return cluster.start_head("--num-cpus=4", "--include-dashboard=false")


def checkpoint_state(run_dir: Path) -> dict:
    root = run_dir / "learner" / "checkpoints"
    return json.loads((root / (root / "latest").read_text().strip() / "state.json").read_text())


def test_a_run_resumes_after_its_whole_ray_cluster_is_gone(cluster, tmp_path, redis_client, redis_url, tiny_model_dir):
    run_dir = tmp_path / "resume"
    settings = [
        *broken_run(tmp_path, "resume", tiny_model_dir, redis_url, start_cluster(cluster)),
        f"learner.checkpoint_every={CHECKPOINT_EVERY}",
        "learner.max_steps=1000",
        # One group outstanding at a time (actors/staleness_admission.py): no finished group waits in the stream
        # behind the one the kill cuts short, so the resumed learner reads that group's abandon marker
        # before it can train anything new. Unbounded, the pool ran groups ahead, the resumed learner
        # reached its last step on them before the marker, and no drop was counted (a CI failure).
        "actors.max_staleness=0",
    ]
    config = load_config("configs/local.yaml", settings)
    stream = config.stream_key()
    first_log = tmp_path / "first.log"
    driver = start_train(cluster, settings, first_log)

    # An audit group that never reads: the driver trims only what every group acknowledged, so the
    # whole stream stays for the counts. Created as soon as the driver made the stream (a stream that
    # exists before the run would be refused), tens of seconds before the first entry.
    deadline = time.monotonic() + 120
    while not redis_client.exists(stream):
        assert driver.poll() is None, f"slea train exited early ({driver.returncode}):\n{output_tail(first_log)}"
        assert time.monotonic() < deadline, f"slea train made no stream {stream} in 120 s:\n{output_tail(first_log)}"
        time.sleep(0.05)
    redis_client.xgroup_create(stream, "audit", id="0")

    # Train until a step past a checkpoint, with a library snapshot on disk: then the cluster goes,
    # the learner frozen first so that it dies between checkpoints, and the actor workers frozen
    # with an episode listed in flight, so that the kill cuts one short (a worker whose group is
    # done waits for the frozen learner to take it (the admission): it may have none in flight).
    deadline = time.monotonic() + 420  # the learner loads in 15 s on an idle machine, in minutes beside a heavy job
    while True:
        trace = trained_trace(run_dir)
        if trace and trace[-1]["learner_step"] > CHECKPOINT_EVERY and latest_snapshot(run_dir) is not None:
            if cluster.signal("ray::LearnerProcess", signal.SIGSTOP) == 1:
                if trained_trace(run_dir)[-1]["learner_step"] % CHECKPOINT_EVERY != 0:
                    cluster.signal("ray::ActorWorkerProcess", signal.SIGSTOP)
                    if any(redis_client.hlen(inflight_key(config.run.id, worker)) for worker in range(2)):
                        break
                    cluster.signal("ray::ActorWorkerProcess", signal.SIGCONT)
                # frozen on a checkpoint, or with no episode in flight: a little further
                cluster.signal("ray::LearnerProcess", signal.SIGCONT)
        assert driver.poll() is None, f"slea train exited early ({driver.returncode}):\n{output_tail(first_log)}"
        assert time.monotonic() < deadline, (
            f"no step past a checkpoint with an episode in flight in 420 s:\n{output_tail(first_log)}"
        )
        time.sleep(0.2)
    driver.kill()
    driver.wait()
    cluster.stop()  # every process of the cluster, SIGKILLed at once

    before = trained_trace(run_dir)
    saved = checkpoint_state(run_dir)
    recorded = int(redis_client.get(policy_version_key(config.run.id)))
    last_entry = redis_client.xrevrange(stream, count=1)[0][0]
    pending = {group: redis_client.xpending(stream, group)["pending"] for group in ("learner", "library")}
    snapshot_header = parse_snapshot(latest_snapshot(run_dir).read_text())[0]
    metrics_lines = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert before[-1]["learner_step"] > saved["learner_step"], "the kill should cut updates short of a checkpoint"
    assert recorded == before[-1]["policy_version"], "every traced version is recorded in Redis"

    # A new cluster; the run continues from its directory and its stream.
    started_at = time.time()
    new_address = start_cluster(cluster)
    resumed_at = time.time()
    target = before[-1]["learner_step"] + 2  # redo the rolled-back steps, then two new ones
    second_log = tmp_path / "second.log"
    with second_log.open("w") as out:
        resumed = subprocess.run(
            [*SLEA, "train", "--resume", str(run_dir), f"--set=ray.address={new_address}"]
            + [f"--set=learner.max_steps={target}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.env,
            timeout=300,
        )
    assert resumed.returncode == 0, output_tail(second_log)

    trace = trained_trace(run_dir)
    after = trace[len(before) :]
    restored, first_trained = after[0], after[1]
    # The learner: from its checkpoint, its weights announced under the next number after the
    # recorded one (the registry died with the cluster), the lost updates redone once.
    assert restored.get("restored") and restored["learner_step"] == saved["learner_step"]
    assert restored["policy_version"] == recorded + 1
    assert first_trained["learner_step"] == saved["learner_step"] + 1
    assert first_trained["policy_version"] == recorded + 2
    versions = [line["policy_version"] for line in trace]
    assert versions == list(range(1, versions[-1] + 1)), f"the version line has a repeat or a gap: {versions}"
    assert lineage(trace)[-1]["learner_step"] == target
    # No record written on the new cluster carries a number the old one used for other weights
    # (version 0, the initial model, is the same weights on both).
    new_records = [
        decode(fields[PAYLOAD_FIELD]) for _id, fields in redis_client.xrange(stream, min=f"({last_entry.decode()}")
    ]
    reissued = {r.policy_version for r in new_records if not r.abandoned and 0 < r.policy_version <= recorded}
    assert new_records and not reissued, f"versions re-issued on the new cluster: {sorted(reissued)}"

    # The library: from its snapshot, not empty, and on from there.
    resumed_lines = [
        line for line in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()[metrics_lines:])
    ]
    library_versions = [line["library/version"] for line in resumed_lines if "library/version" in line]
    assert library_versions and library_versions[0] >= snapshot_header["version"], library_versions
    final_header = parse_snapshot(latest_snapshot(run_dir).read_text())[0]
    assert set(snapshot_header["applied_episodes"]) <= set(final_header["applied_episodes"])

    check_a_broken_run(run_dir, config, redis_client)
    rolled_back = [line for line in before if line["learner_step"] > saved["learner_step"]]
    print(
        f"\ncluster resume: steps before the kill {before[-1]['learner_step']} (checkpoint at step "
        f"{saved['learner_step']}, version {saved['version']}; versions recorded up to {recorded}); "
        f"{len(rolled_back)} step(s) rolled back and redone; entries re-read: learner {pending['learner']}, "
        f"library {pending['library']}; library snapshot v{snapshot_header['version']} "
        f"({len(snapshot_header['applied_episodes'])} episodes) -> v{final_header['version']}; "
        f"new cluster up in {resumed_at - started_at:.1f} s; "
        f"restored weights as version {restored['policy_version']} {restored['at'] - resumed_at:.1f} s after "
        f"`slea train --resume`, first step (step {first_trained['learner_step']}, version "
        f"{first_trained['policy_version']}) after {first_trained['at'] - resumed_at:.1f} s; "
        f"steps after {trace[-1]['learner_step']}, versions 1..{versions[-1]}"
    )
