"""Step-level retrieval: observation -> cluster -> ranked experiences -> token budget.

For each observation: find its cluster (exact structural key, else nearest centroid with
cosine >= delta); take that cluster's strategies and warnings ranked by score + utility; if a
zone yields fewer than k, fill up with the items of that zone and task type whose embeddings
are nearest the observation; then keep items in priority order (strategy 1, warning 1,
strategy 2, ...) while they fit the token budget. The answer carries the library version it
was computed from. Nothing is cached across calls except observation embeddings, which do not
depend on the library.
"""

from __future__ import annotations

import time

import numpy as np

from library.experience import STRATEGY, WARNING
from library.state import Library
from monitoring.metrics import metric

ZONES = (STRATEGY, WARNING)
# (items from the cluster?, items from the similarity fallback?) -> source label of the answer
_SOURCES = {(True, False): "cluster", (True, True): "mixed", (False, True): "fallback", (False, False): "empty"}


def _cluster_ranked(library: Library, cluster_id: str | None, zone: str) -> list[str]:
    if cluster_id is None:
        return []
    items = [library.experiences[i] for i in library.members.get(cluster_id, ()) if library.experiences[i].zone == zone]
    items.sort(key=lambda e: (-e.rank_key(), e.id))
    return [e.id for e in items]


def _nearest(
    library: Library, task_type: str, zone: str, embedding: np.ndarray, exclude: list[str], count: int
) -> list[str]:
    ids, matrix = library.zone_matrix(task_type, zone)
    if count <= 0 or not ids:
        return []
    order = np.argsort(-(matrix @ embedding), kind="stable")
    excluded = set(exclude)
    return [ids[i] for i in order[: count + len(excluded)] if ids[i] not in excluded][:count]


def _within_budget(library: Library, strategies: list[str], warnings: list[str], max_tokens: int) -> list[dict]:
    priority = [
        ids[i] for i in range(max(len(strategies), len(warnings))) for ids in (strategies, warnings) if i < len(ids)
    ]
    chosen, used = [], 0
    for experience_id in priority:
        experience = library.experiences[experience_id]
        if used + experience.tokens <= max_tokens:
            used += experience.tokens
            chosen.append(
                {
                    "experience_id": experience.id,
                    "zone": experience.zone,
                    "level": experience.level,
                    "text": experience.text,
                    "tokens": experience.tokens,
                }
            )
    return chosen


def retrieve_batch(
    library: Library,
    observations: list[str],
    task_types: list[str],
    k_strategies: int = 2,
    k_warnings: int = 1,
    max_tokens: int = 200,
    mode: str = "step",
) -> list[dict]:
    """One answer per (observation, task type): experiences, library_version, cluster_id, source.

    Observations whose cluster is found by key and holds k items per zone cost no embedding;
    the rest are embedded together in one model call."""
    started = time.perf_counter()
    wanted = {STRATEGY: k_strategies, WARNING: k_warnings}
    with library.lock:
        if not library.is_warm():
            answers = [
                {"experiences": [], "library_version": library.version, "cluster_id": None, "source": "warmup"}
                for _ in observations
            ]
            _count(mode, answers, started, len(observations))
            return answers
        found: list[str | None] = []
        ranked: list[dict[str, list[str]]] = []
        needs_vector: list[int] = []
        for index, (observation, task_type) in enumerate(zip(observations, task_types)):
            space = library.clusters.get(task_type)
            cluster = space.find(observation, None) if space else None
            found.append(cluster.id if cluster else None)
            ranked.append({zone: _cluster_ranked(library, found[-1], zone)[: wanted[zone]] for zone in ZONES})
            short = any(len(ranked[-1][zone]) < wanted[zone] for zone in ZONES)
            if space is not None and (cluster is None or short):
                needs_vector.append(index)
        vectors = dict(zip(needs_vector, library.embedder.embed([observations[i] for i in needs_vector])))
        answers = []
        for index, (observation, task_type) in enumerate(zip(observations, task_types)):
            from_fallback = 0
            vector = vectors.get(index)
            if vector is not None:
                if found[index] is None:
                    cluster = library.clusters[task_type].find(observation, vector)
                    found[index] = cluster.id if cluster else None
                    ranked[index] = {
                        zone: _cluster_ranked(library, found[index], zone)[: wanted[zone]] for zone in ZONES
                    }
                for zone in ZONES:
                    extra = _nearest(
                        library, task_type, zone, vector, ranked[index][zone], wanted[zone] - len(ranked[index][zone])
                    )
                    ranked[index][zone] += extra
                    from_fallback += len(extra)
            from_cluster = sum(len(ids) for ids in ranked[index].values()) - from_fallback
            answers.append(
                {
                    "experiences": _within_budget(library, ranked[index][STRATEGY], ranked[index][WARNING], max_tokens),
                    "library_version": library.version,
                    "cluster_id": found[index],
                    "source": _SOURCES[(from_cluster > 0, from_fallback > 0)],
                }
            )
    _count(mode, answers, started, len(observations))
    return answers


def retrieve(
    library: Library,
    observation: str,
    task_type: str,
    k_strategies: int = 2,
    k_warnings: int = 1,
    max_tokens: int = 200,
    mode: str = "step",
) -> dict:
    """Experiences for one observation (see retrieve_batch)."""
    return retrieve_batch(library, [observation], [task_type], k_strategies, k_warnings, max_tokens, mode)[0]


def _count(mode: str, answers: list[dict], started: float, size: int) -> None:
    for answer in answers:
        metric("library_retrievals_total").labels(mode=mode, source=answer["source"]).inc()
    metric("library_retrieval_seconds").labels(kind="single" if size == 1 else "batch").observe(
        time.perf_counter() - started
    )
