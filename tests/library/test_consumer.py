"""The library consumer against a real Redis: stream -> episodes -> admission; snapshot, then ack."""

import threading
import time

import pytest

from library.consumer import GROUP, LibraryWriter
from library.extraction.rules import RulesExtractor
from library.persistence import latest_snapshot
from library.state import Library
from library.sync import Follower
from library_helpers import library_config, steps_of
from slea.config import SleaConfig
from slea.streams import StreamProducer

KITCHEN = ["You are in the kitchen. You see a fridge 1 and a countertop 1.", "On the countertop 1, you see an apple 1.",
           "You pick up the apple 1."]
WIN = ["go to countertop 1", "take apple 1", "put apple 1 in fridge 1"]
LOSE = ["go to countertop 1", "go to countertop 1", "eat apple 1"]


def config(**library) -> SleaConfig:
    values = {"redis": {"block_ms": 20}, "run": {"id": "libtest"}}
    return SleaConfig.model_validate({**values, "library": library_config(**library).model_dump()})


_WRITERS: list[LibraryWriter] = []


def writer_for(cfg, redis_client, run_dir, embedder, extractor=None):
    writer = LibraryWriter(cfg, redis_client, run_dir, Library(cfg.library, embedder), extractor or RulesExtractor())
    _WRITERS.append(writer)
    return writer


@pytest.fixture(autouse=True)
def stop_writer_threads():
    """Writers a test left running (crashed ones on purpose) must not outlive their Redis."""
    yield
    while _WRITERS:
        _WRITERS.pop().stop_worker()  # returns at once for a writer already shut down


def produce(redis_client, cfg, records):
    StreamProducer(redis_client, cfg.stream_key()).send(records)


def group_of(group_id, version, *, experience_id=None):
    """Two successes and two failures of one task, played at policy `version`."""
    records = []
    for index, (actions, success) in enumerate([(WIN, True), (WIN, True), (LOSE, False), (LOSE, False)]):
        injected = None if experience_id is None or index % 2 else [[experience_id]] * 3
        records += steps_of(f"{group_id}-e{index}", KITCHEN, actions, success=success, group_id=group_id,
                            policy_version=version, experience_ids=injected, run_id="libtest")
    return records


def pending(redis_client, cfg) -> int:
    return redis_client.xpending(cfg.stream_key(), GROUP)["pending"]


def drain(writer, rounds=5):
    for _ in range(rounds):
        writer.poll(block_ms=20)
    writer.wait_idle()


def test_window_is_distilled_admitted_and_acked_only_after_the_snapshot(redis_client, embedder, tmp_path):
    cfg = config(snapshot_every=100)
    writer = writer_for(cfg, redis_client, tmp_path, embedder)
    produce(redis_client, cfg, group_of("g1", version=0) + group_of("g2", version=0) + group_of("g3", version=1))
    drain(writer)  # g3 closes the window of version 0 and stays open in the next
    library = writer.library
    assert library.version == 1 and library.learner_version == 0
    zones = sorted((e.zone, e.level) for e in library.experiences.values())
    # one method merges the plans of both successes; finishing moves likewise; one failure pattern/diagnostic
    assert ("strategy", "method") in zones and ("warning", "pattern") in zones and ("warning", "diagnostic") in zones
    assert library.counters["admitted"] == len(library.experiences) and library.counters["merged"] >= 2
    assert pending(redis_client, cfg) == 36  # 24 applied but not yet durable, 12 in the open window
    assert latest_snapshot(tmp_path) is None
    writer.shutdown()  # applies the open window, snapshots, acks
    assert pending(redis_client, cfg) == 0 and latest_snapshot(tmp_path).name == "v000000002.jsonl"


def test_abandoned_episodes_are_ignored_and_acked(redis_client, embedder, tmp_path):
    cfg = config()
    writer = writer_for(cfg, redis_client, tmp_path, embedder)
    records = steps_of("gone", KITCHEN[:2], WIN[:2], success=False, run_id="libtest")
    records[-1].done, records[-1].abandoned = False, True
    produce(redis_client, cfg, records)
    drain(writer)
    assert writer.library.version == 0 and len(writer.buffer) == 0 and pending(redis_client, cfg) == 0


def test_utility_from_injected_experiences_reaches_the_items(redis_client, embedder, tmp_path):
    cfg = config(snapshot_every=1)
    writer = writer_for(cfg, redis_client, tmp_path, embedder)
    produce(redis_client, cfg, group_of("g1", version=0) + group_of("g2", version=1))
    drain(writer)  # window of version 0 applied; g2 waits in the next
    method = next(e for e in writer.library.experiences.values() if e.level == "method")
    # g3 and g4 (version 1, with g2): episodes 0 and 2 saw the method (one won, one lost), 1 and 3 did not
    # (one won, one lost): difference 0 in both groups, 4 exposures of 3 steps; g5 closes the window
    produce(redis_client, cfg, group_of("g3", version=1, experience_id=method.id)
            + group_of("g4", version=1, experience_id=method.id) + group_of("g5", version=2))
    drain(writer)
    assert method.exposures == 4 and method.usage == 12 and method.utility == pytest.approx(0.0)
    writer.shutdown()
    assert pending(redis_client, cfg) == 0  # snapshot_every=1: every change is durable at once


def test_consumption_never_waits_for_extraction(redis_client, embedder, tmp_path):
    release = threading.Event()

    class SlowExtractor(RulesExtractor):
        def distil_success(self, episode, existing):
            release.wait(30)
            return super().distil_success(episode, existing)

    cfg = config()
    writer = writer_for(cfg, redis_client, tmp_path, embedder, SlowExtractor())
    produce(redis_client, cfg, group_of("g1", version=0) + group_of("g2", version=1) + group_of("g3", version=2))
    started = time.monotonic()
    drain_rounds = [writer.poll(block_ms=20) for _ in range(4)]
    assert sum(drain_rounds) == 36 and time.monotonic() - started < 5
    assert writer.windows.unfinished_tasks == 2  # both closed windows wait for the blocked worker; reading went on
    release.set()
    writer.shutdown()
    assert writer.library.version >= 2 and pending(redis_client, cfg) == 0


def test_restart_resumes_from_snapshot_and_pending_entries_without_double_counting(redis_client, embedder, tmp_path):
    cfg = config(snapshot_every=100)
    once = writer_for(cfg, redis_client, tmp_path / "reference", embedder)
    episodes = group_of("g1", version=0) + group_of("g2", version=0) + group_of("g3", version=1)
    produce(redis_client, cfg, episodes)
    drain(once)
    expected = ({e.text: e.score for e in once.library.experiences.values()}, dict(once.library.counters))
    redis_client.delete(cfg.stream_key())

    # crash 1: applied, never snapshotted -> the restarted writer re-reads its pending entries and applies them once
    first = writer_for(cfg, redis_client, tmp_path / "run", embedder)
    produce(redis_client, cfg, episodes)
    drain(first)
    assert pending(redis_client, cfg) == 36
    second = writer_for(cfg, redis_client, tmp_path / "run", embedder)
    drain(second)
    assert ({e.text: e.score for e in second.library.experiences.values()}, second.library.counters) == expected

    # crash 2: snapshot written, ack lost -> the next writer recognises the episodes and only acks them
    second.consumer.ack = lambda entry_ids: None
    second.shutdown()
    assert pending(redis_client, cfg) == 36 and latest_snapshot(tmp_path / "run").name == "v000000002.jsonl"
    third = writer_for(cfg, redis_client, tmp_path / "run", embedder)
    drain(third)
    assert third.library.version == 2 and pending(redis_client, cfg) == 0  # nothing applied twice, all acked
    assert third.library.counters == second.library.counters

    replica = Library(cfg.library, embedder)  # a Serve replica bootstraps from what the writer published
    assert Follower(redis_client, cfg.run.id, replica).sync() == 2 and set(replica.experiences) == set(third.library.experiences)
