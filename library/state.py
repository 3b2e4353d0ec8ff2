"""The library's state: clusters per task type, experiences per zone and level, the version.

One class serves both sides. The writer (the library consumer) changes it through
`assign_observations`, `admit`, `apply_utility` and turns each batch of changes into one new
version with `commit()`, which returns a delta. Serve replicas hold a copy and `apply_delta`
the writer's deltas in order. Every committed change bumps the version; the derived indexes
(cluster members, zone matrices) are rebuilt from the changed items, so nothing derived
outlives the items it was computed from.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from library import admission
from library.clusters import Cluster, TaskClusters
from library.embedding import Embedder
from library.experience import LEVELS, STRATEGY, Candidate, Experience
from monitoring.metrics import metric
from slea.config import LibraryConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

COUNTERS = ("admitted", "merged", "rejected", "evicted", "pruned", "clusters_evicted")


class DeltaGap(RuntimeError):
    """A delta does not continue this copy's version: reload from the snapshot."""


@dataclass
class AdmissionReport:
    """What one `admit` call did, candidate by candidate (counts only what happened)."""

    admitted: list[str] = field(default_factory=list)  # ids of new items
    merged: list[str] = field(default_factory=list)  # ids of items that absorbed a candidate
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (zone, reason) per rejected candidate
    evicted: list[tuple[str, str]] = field(default_factory=list)  # (zone, id) replaced as their level's minimum


class Library:
    """Clusters + experiences + version; thread-safe (one lock, held briefly).

    `policy_tokenizer` (the run's policy tokenizer, `slea.models.load_tokenizer(model.name)`) is
    what admission measures an item's prompt line with; only the writer admits, so copies that
    only follow deltas (Serve replicas) go without it."""

    def __init__(self, cfg: LibraryConfig, embedder: Embedder, policy_tokenizer: PreTrainedTokenizerBase | None = None):
        self.cfg = cfg
        self.embedder = embedder
        self.policy_tokenizer = policy_tokenizer
        self.lock = threading.RLock()
        self._reset()

    def _reset(self) -> None:
        self.version = 0  # bumped by every commit
        self.learner_version = 0  # newest policy version seen in the stream (warm-up)
        self.counters = dict.fromkeys(COUNTERS, 0)  # what happened since the library began
        self.experiences: dict[str, Experience] = {}
        self.clusters: dict[str, TaskClusters] = {}
        self.members: dict[str, set[str]] = {}  # cluster id -> experience ids indexed to it
        self.next_id = 0  # ids are never reused, so an id in an old StepRecord names one item
        self._zone_matrices: dict[tuple[str, str], tuple[list[str], np.ndarray]] = {}
        self._clear_changes()

    def _clear_changes(self) -> None:
        """Forget what changed since the last version (after a commit, delta or load)."""
        self._changed: dict[str, set[str]] = {"experiences": set(), "clusters": set(), "meta": set()}
        self._removed: dict[str, set[str]] = {"experiences": set(), "clusters": set()}

    # ---- reading ------------------------------------------------------------------------------

    def task_clusters(self, task_type: str) -> TaskClusters:
        found = self.clusters.get(task_type)
        if found is None:
            found = self.clusters[task_type] = TaskClusters(
                task_type, self.embedder.dim, self.cfg.max_clusters, self.cfg.delta, self.cfg.group_instance_numbers
            )
        return found

    def cluster_of(self, cluster_id: str) -> Cluster | None:
        task_type = cluster_id.rsplit("/", 1)[0]
        space = self.clusters.get(task_type)
        return space.by_id.get(cluster_id) if space else None

    def zone_matrix(self, task_type: str, zone: str) -> tuple[list[str], np.ndarray]:
        """Ids and embeddings [n, dim] of one zone of one task type (built on demand, dropped on change)."""
        key = (task_type, zone)
        cached = self._zone_matrices.get(key)
        if cached is None:
            ids = [e.id for e in self.experiences.values() if e.task_type == task_type and e.zone == zone]
            matrix = (
                np.stack([self.experiences[i].embedding for i in ids])
                if ids
                else np.zeros((0, self.embedder.dim), dtype=np.float32)
            )
            cached = self._zone_matrices[key] = (ids, matrix)
        return cached

    def level_sizes(self) -> dict[tuple[str, str], int]:
        sizes = {(zone, level): 0 for zone, levels in LEVELS.items() for level in levels}
        for experience in self.experiences.values():
            sizes[(experience.zone, experience.level)] += 1
        return sizes

    def is_warm(self) -> bool:
        """Injection starts after the warm-up: enough learner versions and enough experiences."""
        return self.learner_version >= self.cfg.warmup_versions and len(self.experiences) >= self.cfg.warmup_experiences

    def capacity(self, zone: str, level: str) -> int:
        return (self.cfg.strategy_capacity if zone == STRATEGY else self.cfg.warning_capacity).get(level, 0)

    # ---- writing (the library consumer) ---------------------------------------------------------

    def assign_observations(self, task_type: str, observations: list[str]) -> list[str]:
        """Cluster ids of the observations, founding clusters (and evicting the least used) as needed."""
        with self.lock:
            space = self.task_clusters(task_type)
            unseen = [obs for obs in dict.fromkeys(observations) if space.needs_embedding(obs)]
            vectors = dict(zip(unseen, self.embedder.embed(unseen)))
            assigned = []
            for observation in observations:
                cluster, founded, evicted = space.assign(
                    observation, vectors.get(observation), f"{task_type}/c{self.next_id}"
                )
                if founded:
                    self.next_id += 1
                    self._mark("clusters", cluster.id)
                for gone in evicted:
                    self._drop_cluster(gone.id)
                    self.counters["clusters_evicted"] += 1
                    metric("library_cluster_evictions_total").labels(task_type=task_type).inc()
                assigned.append(cluster.id)
            return assigned

    def prompt_line_tokens(self, text: str) -> int:
        """Tokens an item costs the actors' experience budget (`library.max_tokens`): its prompt
        line `- {text}\n` under the policy tokenizer, counted as actors/prompts.py
        `PromptBuilder.fit_experiences` counts it (the library may not import actors)."""
        if self.policy_tokenizer is None:
            raise RuntimeError(
                "this Library has no policy tokenizer, so it cannot admit: pass "
                "policy_tokenizer=slea.models.load_tokenizer(config.model.name) to the writer's Library"
            )
        return len(self.policy_tokenizer.encode(f"- {text}\n", add_special_tokens=False))

    def admit(self, candidates: list[Candidate], quota: dict[str, int]) -> AdmissionReport:
        """Admit candidates best score first. `quota` (zone -> items this window may still add)
        is decremented by admissions; a candidate beyond it is rejected with reason rate_limit.
        A candidate whose prompt line alone exceeds `library.max_tokens` could never be shown
        (the actor would drop it, and every item ranked after it) and is rejected first, with
        reason over_token_budget, before it can merge into an item and lengthen it."""
        report = AdmissionReport()
        if not candidates:
            return report
        with self.lock:
            ordered = sorted(candidates, key=lambda c: c.score, reverse=True)
            embeddings = self.embedder.embed([f"{c.cue} {c.text()}".strip() for c in ordered])
            for candidate, embedding in zip(ordered, embeddings):
                self._admit_one(candidate, embedding, quota, report)
            return report

    def _admit_one(
        self, candidate: Candidate, embedding: np.ndarray, quota: dict[str, int], report: AdmissionReport
    ) -> None:
        if self.prompt_line_tokens(candidate.text()) > self.cfg.max_tokens:
            report.rejected.append((candidate.zone, "over_token_budget"))
            self.counters["rejected"] += 1
            return
        zone_ids, zone_embeddings = self.zone_matrix(candidate.task_type, candidate.zone)
        level_scores = {
            e.id: e.score for e in self.experiences.values() if e.zone == candidate.zone and e.level == candidate.level
        }
        decision = admission.decide(
            embedding,
            candidate.score,
            zone_ids,
            zone_embeddings,
            level_scores,
            self.capacity(candidate.zone, candidate.level),
            self.cfg.dedup_threshold,
        )
        if decision.action == admission.MERGE:
            self._merge(self.experiences[decision.target_id], candidate, embedding)
            report.merged.append(decision.target_id)
            self.counters["merged"] += 1
            return
        if decision.action == admission.REJECT or quota.get(candidate.zone, 0) <= 0:
            report.rejected.append(
                (candidate.zone, "below_minimum" if decision.action == admission.REJECT else "rate_limit")
            )
            self.counters["rejected"] += 1
            return
        if decision.action == admission.REPLACE:
            self._remove_experience(decision.target_id)
            report.evicted.append((candidate.zone, decision.target_id))
            self.counters["evicted"] += 1
        experience = Experience(
            id=f"x{self.next_id}",
            zone=candidate.zone,
            level=candidate.level,
            task_type=candidate.task_type,
            text=candidate.text(),
            cue=candidate.cue,
            clusters=list(dict.fromkeys(self.assign_observations(candidate.task_type, candidate.trigger_observations))),
            score=candidate.score,
            tokens=self.embedder.count_tokens(candidate.text()),
            embedding=embedding,
            source_episode_ids=list(candidate.source_episode_ids),
            created_at=time.time(),
            created_version=self.version + 1,
        )
        self.next_id += 1
        self._add_experience(experience)
        quota[candidate.zone] -= 1
        report.admitted.append(experience.id)
        self.counters["admitted"] += 1

    def _merge(self, kept: Experience, candidate: Candidate, embedding: np.ndarray) -> None:
        """A near-duplicate joins the existing item: the higher score's wording and score win,
        triggers and sources are united, zone and level stay (capacity accounting is unchanged)."""
        if candidate.score > kept.score:
            kept.text, kept.cue, kept.score, kept.embedding = (
                candidate.text(),
                candidate.cue,
                candidate.score,
                embedding,
            )
            kept.tokens = self.embedder.count_tokens(kept.text)
        new_clusters = self.assign_observations(candidate.task_type, candidate.trigger_observations)
        self._unindex(kept)
        kept.clusters = list(dict.fromkeys(kept.clusters + new_clusters))
        kept.source_episode_ids = list(dict.fromkeys(kept.source_episode_ids + candidate.source_episode_ids))
        self._index(kept)
        self._mark("experiences", kept.id)

    def apply_utility(self, evidence: dict[str, admission.Evidence], usage: dict[str, int]) -> list[Experience]:
        """One window's EDGE update from `admission.utility_evidence` and step usage counts; call
        it once per extraction window, since the prune rule counts windows. Returns the pruned items.

        Only A/B evidence moves an item: its utility (exponential average of the window's gain),
        its run of low windows, and so whether it is pruned. A window that gave it no A/B evidence
        (a run without A/B groups, shown only in groups without a B half, only at steps without a
        cluster, or where no B episode reached the clusters it was shown at) adds exposures and
        usage and leaves the rest as it was: no evidence, no verdict."""
        pruned = []
        with self.lock:
            for experience_id, found in evidence.items():
                experience = self.experiences.get(experience_id)
                if experience is None:  # evicted or pruned since it was injected
                    continue
                experience.exposures += found.exposures
                experience.usage += usage.get(experience_id, 0)
                self._mark("experiences", experience_id)
                if found.gain is None:
                    continue
                experience.compared += found.compared
                experience.utility = admission.exponential_average(
                    experience.utility, found.gain, self.cfg.utility_rate
                )
                experience.low_windows = admission.low_windows_after(
                    experience.utility, experience.low_windows, self.cfg.prune_utility_at_or_below
                )
                if admission.should_prune(
                    experience.low_windows, experience.compared, self.cfg.prune_windows, self.cfg.prune_min_exposures
                ):
                    self._remove_experience(experience_id)
                    self.counters["pruned"] += 1
                    pruned.append(experience)
        return pruned

    def see_learner_version(self, policy_version: int) -> None:
        with self.lock:
            if policy_version > self.learner_version:
                self.learner_version = policy_version
                self._changed["meta"].add("learner_version")  # warm-up depends on it: a change like any other

    def commit(self) -> dict | None:
        """Close the pending changes into one new version; returns the delta (None if nothing changed)."""
        with self.lock:
            if not any(self._changed.values()) and not any(self._removed.values()):
                return None
            delta = {
                "from_version": self.version,
                "version": self.version + 1,
                "learner_version": self.learner_version,
                "next_id": self.next_id,
                "counters": dict(self.counters),
                "experiences": [
                    self.experiences[i].to_json() for i in sorted(self._changed["experiences"]) if i in self.experiences
                ],
                "removed_experiences": sorted(self._removed["experiences"]),
                "clusters": [c.to_json() for i in sorted(self._changed["clusters"]) if (c := self.cluster_of(i))],
                "removed_clusters": sorted(self._removed["clusters"]),
            }
            self.version += 1
            self._clear_changes()
            return delta

    # ---- following (Serve replicas) and restoring ----------------------------------------------

    def apply_delta(self, delta: dict) -> None:
        """Replay a writer's delta; raises DeltaGap unless it continues exactly this version."""
        with self.lock:
            if delta["from_version"] != self.version:
                raise DeltaGap(f"delta from version {delta['from_version']} does not follow version {self.version}")
            for cluster_id in delta["removed_clusters"]:
                if self.cluster_of(cluster_id):
                    self._drop_cluster(cluster_id)
            for experience_id in delta["removed_experiences"]:
                if experience_id in self.experiences:
                    self._remove_experience(experience_id)
            for record in delta["clusters"]:
                self.task_clusters(record["task_type"]).add(Cluster.from_json(record))
            for record in delta["experiences"]:
                if record["id"] in self.experiences:
                    self._remove_experience(record["id"])
                self._add_experience(Experience.from_json(record))
            self.version, self.learner_version = delta["version"], delta["learner_version"]
            self.next_id, self.counters = delta["next_id"], dict(delta["counters"])
            self._clear_changes()

    def load(self, header: dict, clusters: list[Cluster], experiences: list[Experience]) -> None:
        """Replace the whole state with a snapshot's (see library.persistence)."""
        with self.lock:
            self._reset()
            self.version, self.learner_version = header["version"], header["learner_version"]
            self.next_id, self.counters = header["next_id"], {**self.counters, **header["counters"]}
            for cluster in clusters:  # snapshot order is least recently used first
                self.task_clusters(cluster.task_type).add(cluster)
            for experience in experiences:
                self._add_experience(experience)
            self._clear_changes()

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _mark(self, kind: str, item_id: str) -> None:
        self._changed[kind].add(item_id)
        self._removed[kind].discard(item_id)

    def _index(self, experience: Experience) -> None:
        for cluster_id in experience.clusters:
            self.members.setdefault(cluster_id, set()).add(experience.id)
        self._zone_matrices.pop((experience.task_type, experience.zone), None)

    def _unindex(self, experience: Experience) -> None:
        for cluster_id in experience.clusters:
            self.members.get(cluster_id, set()).discard(experience.id)
        self._zone_matrices.pop((experience.task_type, experience.zone), None)

    def _add_experience(self, experience: Experience) -> None:
        experience.clusters = [c for c in experience.clusters if self.cluster_of(c)]
        self.experiences[experience.id] = experience
        self._index(experience)
        self._mark("experiences", experience.id)

    def _remove_experience(self, experience_id: str) -> None:
        experience = self.experiences.pop(experience_id)
        self._unindex(experience)
        self._changed["experiences"].discard(experience_id)
        self._removed["experiences"].add(experience_id)

    def _drop_cluster(self, cluster_id: str) -> None:
        """Forget a cluster; its experiences stay (fallback still finds them) but lose that trigger."""
        space = self.clusters[cluster_id.rsplit("/", 1)[0]]
        if cluster_id in space.by_id:
            space.remove(cluster_id)
        for experience_id in self.members.pop(cluster_id, set()):
            experience = self.experiences[experience_id]
            experience.clusters = [c for c in experience.clusters if c != cluster_id]
            self._mark("experiences", experience_id)
        self._changed["clusters"].discard(cluster_id)
        self._removed["clusters"].add(cluster_id)
