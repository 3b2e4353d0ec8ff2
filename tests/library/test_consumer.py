"""The library consumer against a real Redis: stream -> episodes -> admission; snapshot, then ack."""

import threading
import time

import pytest
from library_helpers import library_config, steps_of

from library.consumer import GROUP, LibraryWriter
from library.extraction.rules import RulesExtractor
from library.persistence import latest_snapshot
from library.state import Library
from library.sync import Follower
from slea.config import SleaConfig
from slea.streams import StreamProducer

KITCHEN = [
    "You are in the kitchen. You see a fridge 1 and a countertop 1.",
    "On the countertop 1, you see an apple 1.",
    "You pick up the apple 1.",
]
WIN = ["go to countertop 1", "take apple 1", "put apple 1 in fridge 1"]
LOSE = ["go to countertop 1", "go to countertop 1", "eat apple 1"]


def config(**library) -> SleaConfig:
    values = {"redis": {"block_ms": 20}, "run": {"id": "libtest"}}
    return SleaConfig.model_validate({**values, "library": library_config(**library).model_dump()})


_WRITERS: list[LibraryWriter] = []


def writer_for(cfg, redis_client, run_dir, embedder, tokenizer, extractor=None):
    writer = LibraryWriter(
        cfg, redis_client, run_dir, Library(cfg.library, embedder, tokenizer), extractor or RulesExtractor()
    )
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


def group_of(
    group_id,
    version,
    *,
    experience_id=None,
    shown=(0, 2),
    outcomes=(True, True, False, False),
    b_half=(),
    clusters=None,
):
    """Four episodes of one task played at policy `version` (two successes, then two failures, by
    default); those at `shown` were shown `experience_id`; those at `b_half` are the B half of an
    A/B group (shown nothing); `clusters`: the anchor cluster of each KITCHEN step (None: none)."""
    records = []
    for index, success in enumerate(outcomes):
        injected = [[experience_id]] * 3 if experience_id is not None and index in shown else None
        records += steps_of(
            f"{group_id}-e{index}",
            KITCHEN,
            WIN if success else LOSE,
            success=success,
            group_id=group_id,
            policy_version=version,
            experience_ids=injected,
            run_id="libtest",
            with_experience=index not in b_half,
            clusters=clusters,
        )
    return records


def pending(redis_client, cfg) -> int:
    return redis_client.xpending(cfg.stream_key(), GROUP)["pending"]


def drain(writer, rounds=5):
    for _ in range(rounds):
        writer.poll(block_ms=20)
    writer.wait_idle()


def test_window_is_distilled_admitted_and_acked_only_after_the_snapshot(
    redis_client, embedder, policy_tokenizer, tmp_path
):
    cfg = config(snapshot_every=100)
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
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


def test_abandoned_episodes_are_ignored_and_acked(redis_client, embedder, policy_tokenizer, tmp_path):
    cfg = config()
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
    records = steps_of("gone", KITCHEN[:2], WIN[:2], success=False, run_id="libtest")
    records[-1].done, records[-1].abandoned = False, True
    produce(redis_client, cfg, records)
    drain(writer)
    assert writer.library.version == 0 and len(writer.buffer) == 0 and pending(redis_client, cfg) == 0


def first_window(writer, redis_client, cfg, zone):
    """Play a window (version 0) that fills the library; returns its first item of `zone`. The
    version-1 group that closes it waits in the next window."""
    produce(redis_client, cfg, group_of("g1", version=0) + group_of("g2", version=1))
    drain(writer)
    return next(e for e in writer.library.experiences.values() if e.zone == zone)


def test_exposures_reach_the_items_and_groups_without_ab_halves_leave_utility_alone(
    redis_client, embedder, policy_tokenizer, tmp_path
):
    cfg = config(snapshot_every=1)
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
    method = first_window(writer, redis_client, cfg, "strategy")
    assert (writer.prompts_seen, writer.prompts_showing) == (12, {"strategy": 0, "warning": 0})  # g1: 4 x 3 steps
    # g3 and g4 (version 1, with g2): episodes 0 and 2 saw the method, 3 steps each; g5 closes the window
    produce(
        redis_client,
        cfg,
        group_of("g3", version=1, experience_id=method.id)
        + group_of("g4", version=1, experience_id=method.id)
        + group_of("g5", version=2),
    )
    drain(writer)
    assert (method.exposures, method.usage, method.utility, method.compared) == (4, 12, 0.0, 0)
    # the window held g2, g3, g4: 36 prompts, 12 of them (2 episodes x 3 steps x 2 groups) showed the method
    assert (writer.prompts_seen, writer.prompts_showing) == (48, {"strategy": 12, "warning": 0})
    writer.shutdown()
    assert pending(redis_client, cfg) == 0  # snapshot_every=1: every change is durable at once


def test_a_warning_shown_only_to_failing_episodes_without_ab_halves_is_never_pruned(
    redis_client, embedder, policy_tokenizer, tmp_path
):
    cfg = config(snapshot_every=100)  # default prune settings
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
    warning = first_window(writer, redis_client, cfg, "warning")
    records = []
    for version in range(1, 5):  # four windows, each two groups whose two failures (only) were shown the warning
        records += [
            r for g in ("a", "b") for r in group_of(f"w{version}{g}", version, experience_id=warning.id, shown=(2, 3))
        ]
    produce(redis_client, cfg, records + group_of("close", version=5))
    drain(writer, rounds=10)
    # before: -1 per window (0/2 with it, 2/2 without), pruned in the second window (8 exposures, utility -0.36 < 0)
    assert writer.library.experiences.get(warning.id) is warning and writer.library.counters["pruned"] == 0
    assert (warning.exposures, warning.utility, warning.low_windows) == (16, 0.0, 0)


def test_ab_evidence_prunes_after_two_low_windows_across_a_restart(redis_client, embedder, policy_tokenizer, tmp_path):
    cfg = config(snapshot_every=100, utility_rate=0.5, prune_min_exposures=2)
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
    warning = first_window(writer, redis_client, cfg, "warning")
    # both halves walk the same KITCHEN states, anchored to the clusters the first window founded
    # (without anchor clusters no B episode could be matched, and no window would give evidence)
    ab = dict(
        experience_id=warning.id,
        shown=(0, 1),
        outcomes=(False, False, True, True),
        b_half=(2, 3),
        clusters=writer.library.assign_observations("pick", KITCHEN),
    )
    # A half (shown the warning) 0/2, B half, all of which reached its clusters, 2/2: gain -1,
    # utility 0.5 * -1 = -0.5: a first low window
    produce(redis_client, cfg, group_of("ab1", version=1, **ab) + group_of("g3", version=2))
    drain(writer)
    assert (warning.utility, warning.low_windows, warning.compared) == (pytest.approx(-0.5), 1, 2)
    writer.shutdown()  # the open window (g3) gives no A/B evidence: the run of low windows stands; snapshot

    restarted = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
    restored = restarted.library.experiences[warning.id]
    assert (restored.utility, restored.low_windows, restored.compared) == (pytest.approx(-0.5), 1, 2)
    produce(redis_client, cfg, group_of("ab2", version=3, **ab) + group_of("g4", version=4))
    drain(restarted)  # utility -0.75: the second low window in a row -> pruned
    assert warning.id not in restarted.library.experiences and restarted.library.counters["pruned"] == 1


CELLAR = [KITCHEN[0], "You fall through a trapdoor into the cellar.", "The cellar is dark and the hatch is shut."]


def test_a_neutral_warning_shown_where_episodes_fail_survives_ab_windows(
    redis_client, embedder, policy_tokenizer, tmp_path
):
    cfg = config(
        snapshot_every=100, utility_rate=1.0, prune_min_exposures=2
    )  # the literal rule: each window's own gain
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer)
    warning = first_window(writer, redis_client, cfg, "warning")
    # the library already holds the cellar states (what a replica answers with), apart from the kitchen's
    kitchen, cellar = (writer.library.assign_observations("pick", observations) for observations in (KITCHEN, CELLAR))
    assert not set(cellar[1:]) & set(kitchen)

    def episode(group_id, version, index, success, down, a_half):
        return steps_of(
            f"{group_id}-e{index}",
            CELLAR if down else KITCHEN,
            WIN if success else LOSE,
            success=success,
            group_id=group_id,
            policy_version=version,
            run_id="libtest",
            with_experience=a_half,
            clusters=cellar if down else kitchen,
            experience_ids=[[], [warning.id], [warning.id]] if down and a_half else None,
        )

    records = []
    for version in (1, 2):  # two windows of one A/B group; in each half two episodes fall into the cellar, one fails
        group = f"ab{version}"
        records += [
            r
            for index, (success, down, a_half) in enumerate(
                [
                    (True, False, True),
                    (True, False, True),
                    (True, True, True),
                    (False, True, True),
                    (True, False, False),
                    (True, False, False),
                    (True, True, False),
                    (False, True, False),
                ]
            )
            for r in episode(group, version, index, success, down, a_half)
        ]
    produce(redis_client, cfg, records + group_of("close", version=3))
    drain(writer, rounds=10)
    # shown it 1/2 - B episodes in the cellar 1/2 = 0 per window; before: 1/2 - the whole B half 3/4 = -0.25,
    # at the threshold twice with 4 A-half episodes behind it: pruned in the second window
    assert writer.library.experiences.get(warning.id) is warning and writer.library.counters["pruned"] == 0
    assert (warning.utility, warning.low_windows, warning.compared, warning.exposures) == (0.0, 0, 4, 4)


def test_consumption_never_waits_for_extraction(redis_client, embedder, policy_tokenizer, tmp_path):
    release = threading.Event()

    class SlowExtractor(RulesExtractor):
        def distil_success(self, episode, existing):
            release.wait(30)
            return super().distil_success(episode, existing)

    cfg = config()
    writer = writer_for(cfg, redis_client, tmp_path, embedder, policy_tokenizer, SlowExtractor())
    produce(redis_client, cfg, group_of("g1", version=0) + group_of("g2", version=1) + group_of("g3", version=2))
    started = time.monotonic()
    drain_rounds = [writer.poll(block_ms=20) for _ in range(4)]
    assert sum(drain_rounds) == 36 and time.monotonic() - started < 5
    assert writer.windows.unfinished_tasks == 2  # both closed windows wait for the blocked worker; reading went on
    release.set()
    writer.shutdown()
    assert writer.library.version >= 2 and pending(redis_client, cfg) == 0


def test_restart_resumes_from_snapshot_and_pending_entries_without_double_counting(
    redis_client, embedder, policy_tokenizer, tmp_path
):
    cfg = config(snapshot_every=100)
    once = writer_for(cfg, redis_client, tmp_path / "reference", embedder, policy_tokenizer)
    episodes = group_of("g1", version=0) + group_of("g2", version=0) + group_of("g3", version=1)
    produce(redis_client, cfg, episodes)
    drain(once)
    expected = ({e.text: e.score for e in once.library.experiences.values()}, dict(once.library.counters))
    redis_client.delete(cfg.stream_key())

    # crash 1: applied, never snapshotted -> the restarted writer re-reads its pending entries and applies them once
    first = writer_for(cfg, redis_client, tmp_path / "run", embedder, policy_tokenizer)
    produce(redis_client, cfg, episodes)
    drain(first)
    assert pending(redis_client, cfg) == 36
    second = writer_for(cfg, redis_client, tmp_path / "run", embedder, policy_tokenizer)
    drain(second)
    assert ({e.text: e.score for e in second.library.experiences.values()}, second.library.counters) == expected

    # crash 2: snapshot written, ack lost -> the next writer recognises the episodes and only acks them
    second.consumer.ack = lambda entry_ids: None
    second.shutdown()
    assert pending(redis_client, cfg) == 36 and latest_snapshot(tmp_path / "run").name == "v000000002.jsonl"
    third = writer_for(cfg, redis_client, tmp_path / "run", embedder, policy_tokenizer)
    drain(third)
    assert third.library.version == 2 and pending(redis_client, cfg) == 0  # nothing applied twice, all acked
    assert third.library.counters == second.library.counters

    replica = Library(cfg.library, embedder)  # a Serve replica bootstraps from what the writer published
    assert Follower(redis_client, cfg.run.id, replica).sync() == 2 and set(replica.experiences) == set(
        third.library.experiences
    )


def test_a_writer_with_an_empty_run_directory_restores_the_library_redis_last_served(
    redis_client, embedder, policy_tokenizer, tmp_path
):
    """A library pod that comes back without its run directory must continue the run's library,
    not publish an empty one over what the replicas serve."""
    cfg = config(snapshot_every=1)
    episodes = group_of("g1", version=0) + group_of("g2", version=0) + group_of("g3", version=1)
    first = writer_for(cfg, redis_client, tmp_path / "lost", embedder, policy_tokenizer)
    produce(redis_client, cfg, episodes)
    drain(first)
    first.shutdown()
    served = ({e.id: e.text for e in first.library.experiences.values()}, first.library.version)
    assert served[1] >= 2 and pending(redis_client, cfg) == 0

    second = writer_for(cfg, redis_client, tmp_path / "empty", embedder, policy_tokenizer)
    assert ({e.id: e.text for e in second.library.experiences.values()}, second.library.version) == served
    assert second.library.counters == first.library.counters
    assert latest_snapshot(tmp_path / "empty").name == f"v{served[1]:09d}.jsonl"  # the directory holds it again
    replica = Library(cfg.library, embedder)
    assert Follower(redis_client, cfg.run.id, replica).sync() == served[1] and set(replica.experiences) == set(
        served[0]
    )
    # The episodes it holds came with it: delivered again (a retried XADD, a reset group), they are only acked.
    produce(redis_client, cfg, episodes)
    drain(second)
    assert second.library.version == served[1] and pending(redis_client, cfg) == 0
