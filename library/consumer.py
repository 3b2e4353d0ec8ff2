"""The library consumer: step stream -> episodes -> windows -> extraction and admission.

Two threads. The consume thread only reads the stream (group "library") and buffers steps
into episodes, and episodes into windows; it never waits for extraction. A window closes when
the policy version has advanced `window_versions` past its start (or after `window_seconds`)
and goes to the worker thread, which updates utilities, clusters the visited observations,
distils the best successes and worst failures, admits candidates under the window's quota,
commits one new version, publishes the delta to Serve replicas and snapshots when due.

Stream entries are acknowledged only when their effect is durable: after the snapshot that
holds it, or at once when they change nothing (abandoned or duplicate episodes, windows that
changed nothing). The snapshot lists the episodes it holds, so an entry redelivered after a
crash between snapshot and ack is recognised and acknowledged, never applied twice. A writer
starts from the run directory's latest snapshot, or from the last one published to Redis when the
directory has none, so a writer on a new pod continues the run's library instead of emptying it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import redis

from library import admission
from library.episodes import Episode, EpisodeBuffer, episode_score, select_for_extraction
from library.experience import STRATEGY, WARNING, Experience
from library.persistence import latest_snapshot, load_snapshot_text, snapshot_text, write_snapshot
from library.state import AdmissionReport, Library
from library.sync import Publisher
from monitoring.metrics import metric
from slea.config import SleaConfig
from slea.streams import StreamConsumer

log = logging.getLogger(__name__)

GROUP = "library"
REMEMBERED_EPISODES = 50_000  # applied episode ids kept for idempotency (snapshot header)


@dataclass
class Window:
    """Episodes finished within one extraction window."""

    episodes: list[Episode] = field(default_factory=list)  # in completion order
    start_version: int | None = None  # policy version of its first episode
    started_at: float = field(default_factory=time.monotonic)  # for time-based windows


class LibraryWriter:
    """Owns the authoritative Library of a run; see the module docstring."""

    def __init__(
        self,
        config: SleaConfig,
        client: redis.Redis,
        run_dir: str | Path,
        library: Library,
        extractor,
        consumer_name: str = "library-0",
    ):
        self.cfg = config.library
        self.run_dir = Path(run_dir)
        self.library = library
        self.extractor = extractor
        self.durable: OrderedDict[str, None] = OrderedDict()  # episodes whose effect a snapshot holds
        self.publisher = Publisher(client, config.run.id, config.redis.reconnect_max_s)
        self._restore()
        self.snapshot_version = library.version
        self.publisher.start(snapshot_text(library, list(self.durable)))
        self.consumer = StreamConsumer(
            client,
            config.stream_key(),
            group=GROUP,
            consumer=consumer_name,
            dead_letter_key=config.dead_letter_key(),
            max_deliveries=config.redis.max_deliveries,
            claim_idle_ms=config.redis.claim_idle_ms,
            reconnect_max_s=config.redis.reconnect_max_s,
        )
        self.read_count, self.block_ms = config.redis.read_count, config.redis.block_ms
        self.buffer = EpisodeBuffer()
        self.window = Window()
        self.in_flight: set[str] = set()  # episodes handed to the worker, not yet in a snapshot
        self.pending_episodes: list[str] = []  # applied episodes the next snapshot makes durable
        self.awaiting_snapshot: list[str] = []  # entry ids whose effect the next snapshot makes durable
        self.oldest_awaiting: float | None = None  # monotonic time the oldest of them was applied
        self.windows: queue.Queue[Window | None] = queue.Queue()
        # Training prompts (steps) this writer applied, and those that showed at least one strategy
        # or warning: the study's "share of prompts that showed each" (cumulative, from 0 at start).
        self.prompts_seen = 0
        self.prompts_showing: dict[str, int] = {STRATEGY: 0, WARNING: 0}
        self.failed: BaseException | None = None  # the worker's fatal error, if any
        self._worker = threading.Thread(target=self._work, name="library-worker", daemon=True)
        self._worker.start()

    def _restore(self) -> None:
        """Continue the library of an earlier writer: from the run directory's latest snapshot, or,
        when the directory has none (a new pod, a lost volume), from the last snapshot published to
        Redis, which is never older than the entries acknowledged (every ack follows a snapshot's
        publish). Only a run with neither starts empty; publishing an empty library over the
        served one would throw the run's library away."""
        restored = latest_snapshot(self.run_dir)
        if restored is not None:
            text, source = restored.read_text(), str(restored)
        else:
            text, source = self.publisher.published_snapshot(), "Redis"
            if text is None:
                return
        header = load_snapshot_text(self.library, text)
        self.durable.update(dict.fromkeys(header["applied_episodes"]))
        if restored is None:  # the run directory holds the library again
            write_snapshot(self.run_dir, text, self.library.version)
        log.info("library restored from %s (version %d)", source, self.library.version)

    # ---- consume thread ------------------------------------------------------------------------

    def poll(self, block_ms: int | None = None) -> int:
        """Read once from the stream and buffer what arrived; returns the entries read."""
        deliveries = self.consumer.read(self.read_count, self.block_ms if block_ms is None else block_ms)
        ack_now = []
        for delivery in deliveries:
            record = delivery.record
            if record.episode_id in self.durable:
                ack_now.append(delivery.entry_id)  # redelivered after its snapshot: already applied
                if record.done:
                    metric("library_episodes_total").labels(outcome="duplicate").inc()
                continue
            if record.episode_id in self.in_flight:
                continue  # its window is being applied; the entry is acked with it
            if record.abandoned:
                ack_now += self.buffer.drop(record.episode_id) + [delivery.entry_id]
                metric("library_episodes_total").labels(outcome="abandoned").inc()
                continue
            episode = self.buffer.add(delivery.entry_id, record)
            if episode is not None:
                self._add_to_window(episode)
        self.consumer.ack(ack_now)
        if self._window_due():
            self.close_window()
        return len(deliveries)

    def _add_to_window(self, episode: Episode) -> None:
        """A window holds the episodes of policy versions [start, start + window_versions): the
        first episode of a later version closes it, even within one read batch."""
        if (
            self.cfg.window_seconds is None
            and self.window.episodes
            and episode.policy_version - self.window.start_version >= self.cfg.window_versions
        ):
            self.close_window()
        if self.window.start_version is None:
            self.window.start_version = episode.policy_version
            self.window.started_at = time.monotonic()
        self.window.episodes.append(episode)
        self.in_flight.add(episode.episode_id)
        metric("library_episodes_total").labels(outcome="success" if episode.success else "failure").inc()

    def _window_due(self) -> bool:
        """Time-based windows close on the clock (version-based ones close in _add_to_window)."""
        return (
            self.cfg.window_seconds is not None
            and bool(self.window.episodes)
            and time.monotonic() - self.window.started_at >= self.cfg.window_seconds
        )

    def close_window(self) -> None:
        """Hand the current window to the worker (also called at shutdown for the last one)."""
        if self.window.episodes:
            self.windows.put(self.window)
            self.window = Window()

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set, then apply the open window, snapshot and ack."""
        while not stop.is_set():
            if self.failed is not None:
                raise RuntimeError("library worker failed; entries stay pending for the next start") from self.failed
            self.poll()
        self.shutdown()

    def shutdown(self) -> None:
        self.close_window()
        self.windows.put(None)
        self._worker.join()
        if self.failed is None:
            self._snapshot()

    def stop_worker(self) -> None:
        """Stop the worker thread without applying or snapshotting anything: what a crash leaves
        behind (entries stay pending for the next writer). `shutdown()` is the graceful stop."""
        self.windows.put(None)
        self._worker.join()

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Block until the worker has applied every window handed to it (tests, benchmarks)."""
        deadline = time.monotonic() + timeout_s
        while self.windows.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.windows.unfinished_tasks:
            raise TimeoutError(f"library worker still busy after {timeout_s}s")

    # ---- worker thread -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            try:
                window = self.windows.get(timeout=1.0)
            except queue.Empty:
                self._snapshot_if_due()
                continue
            try:
                if window is None:
                    return
                self.apply_window(window)
            except Exception as exc:  # a bug here must stop the writer loudly, not lose entries quietly
                log.exception("library worker failed on a window")
                self.failed = exc
                return
            finally:
                self.windows.task_done()

    def apply_window(self, window: Window) -> None:
        library = self.library
        episodes = window.episodes
        library.see_learner_version(max(episode.policy_version for episode in episodes))
        self._count_prompts(episodes)  # before utility pruning drops an item a prompt showed
        outcomes = [episode.outcome() for episode in episodes]
        usage: dict[str, int] = {}
        for episode in episodes:
            for step in episode.steps:
                for experience_id in step.experience_ids:
                    usage[experience_id] = usage.get(experience_id, 0) + 1
        pruned = library.apply_utility(admission.utility_evidence(outcomes), usage)
        for episode in episodes:
            library.assign_observations(episode.task_type, [step.anchor_obs for step in episode.steps])
        successes, failures = select_for_extraction(
            episodes, self.cfg.max_successes_per_window, self.cfg.max_failures_per_window
        )
        candidates = []
        for episode in successes:
            candidates += self._extract(self.extractor.distil_success, episode, self._existing_strategies(episode), "B")
        for episode in failures:
            candidates += self._extract(self.extractor.distil_failure, episode, self._reference(episode, episodes), "C")
        quota = {STRATEGY: self.cfg.max_strategies_per_window, WARNING: self.cfg.max_warnings_per_window}
        report = library.admit(candidates, quota)
        delta = library.commit()
        self._count(report, pruned)
        entry_ids = [entry for episode in episodes for entry in episode.entry_ids]
        if delta is None:  # nothing changed, so nothing needs to be durable before the ack
            applied = [episode.episode_id for episode in episodes]
            self.durable.update(dict.fromkeys(applied))
            self.in_flight.difference_update(applied)
            self.consumer.ack(entry_ids)
            return
        self.publisher.publish_delta(delta)
        self.awaiting_snapshot += entry_ids
        self.oldest_awaiting = self.oldest_awaiting or time.monotonic()
        self.pending_episodes += [episode.episode_id for episode in episodes]
        self._snapshot_if_due()

    def _count_prompts(self, episodes: list[Episode]) -> None:
        """Count each step's prompt once, and once per zone it showed an item of. An item the library
        evicted before this window has no zone any more and is not counted."""
        experiences = self.library.experiences
        with self.library.lock:
            for episode in episodes:
                for step in episode.steps:
                    zones = {experiences[i].zone for i in step.experience_ids if i in experiences}
                    for zone in zones:
                        self.prompts_showing[zone] += 1
                    self.prompts_seen += 1

    def _extract(self, distil, episode: Episode, context, prompt: str) -> list:
        started = time.perf_counter()
        metric("library_extraction_calls_total").labels(backend=self.extractor.name, prompt=prompt).inc()
        try:
            return distil(episode, context)
        except Exception as exc:  # an endpoint that is down costs this episode's lessons, not the run
            log.warning("extraction of episode %s failed: %s", episode.episode_id, exc)
            metric("library_extraction_failures_total").labels(backend=self.extractor.name, reason="error").inc()
            return []
        finally:
            metric("library_extraction_seconds").labels(backend=self.extractor.name).observe(
                time.perf_counter() - started
            )

    def _existing_strategies(self, episode: Episode) -> list[str]:
        """Strategies already indexed to the clusters this episode visited (context of Prompt B)."""
        library = self.library
        with library.lock:
            space = library.clusters.get(episode.task_type)
            touched = {c.id for step in episode.steps if space and (c := space.find(step.anchor_obs, None))}
            ids = {i for cluster_id in touched for i in library.members.get(cluster_id, ())}
            return [library.experiences[i].text for i in sorted(ids) if library.experiences[i].zone == STRATEGY]

    @staticmethod
    def _reference(failure: Episode, episodes: list[Episode]) -> Episode | None:
        """The best success of the failure's task group in this window (context of Prompt C)."""
        same_group = [e for e in episodes if e.group_id == failure.group_id and e.success]
        return max(same_group, key=episode_score) if same_group else None

    def _count(self, report: AdmissionReport, pruned: list[Experience]) -> None:
        for experience_id in report.admitted:
            zone = (
                self.library.experiences[experience_id].zone if experience_id in self.library.experiences else "unknown"
            )
            metric("library_admission_events_total").labels(zone=zone, event="admitted").inc()
        for experience_id in report.merged:
            zone = (
                self.library.experiences[experience_id].zone if experience_id in self.library.experiences else "unknown"
            )
            metric("library_admission_events_total").labels(zone=zone, event="merged").inc()
        for zone, reason in report.rejected:
            metric("library_admission_events_total").labels(zone=zone, event="rejected").inc()
            metric("library_rejections_total").labels(zone=zone, reason=reason).inc()
        for zone, _experience_id in report.evicted:
            metric("library_admission_events_total").labels(zone=zone, event="evicted").inc()
        for experience in pruned:
            metric("library_admission_events_total").labels(zone=experience.zone, event="pruned").inc()
        for (zone, level), size in self.library.level_sizes().items():
            metric("library_experiences").labels(zone=zone, level=level).set(size)
        for task_type, space in self.library.clusters.items():
            metric("library_clusters").labels(task_type=task_type).set(len(space))
        metric("library_version").set(self.library.version)

    # ---- durability ----------------------------------------------------------------------------

    def _snapshot_if_due(self) -> None:
        if self.library.version - self.snapshot_version >= self.cfg.snapshot_every or (
            self.oldest_awaiting is not None and time.monotonic() - self.oldest_awaiting >= self.cfg.snapshot_max_age_s
        ):
            self._snapshot()

    def _snapshot(self) -> None:
        """Write and publish a snapshot, then acknowledge every entry whose effect it holds."""
        applied = self.pending_episodes
        self.durable.update(dict.fromkeys(applied))
        while len(self.durable) > REMEMBERED_EPISODES:
            self.durable.popitem(last=False)
        text = snapshot_text(self.library, list(self.durable))
        write_snapshot(self.run_dir, text, self.library.version)
        self.publisher.publish_snapshot(text)
        self.snapshot_version = self.library.version
        self.consumer.ack(self.awaiting_snapshot)
        self.in_flight.difference_update(applied)
        self.awaiting_snapshot, self.pending_episodes, self.oldest_awaiting = [], [], None
