"""`slea bench retrieval --json`: retrieval latency in-process vs Serve handle vs HTTP, one run.

A library of `experiences` items over `clusters` clusters of one task type (the worst case:
one hnswlib index holds them all); batches of `batch_size` observations of known states, as
actors replaying a task send them, answered by each path in turn. `ratio` is handle p50 over
in-process p50; these machines are noisy, ratios travel better than milliseconds.

The library's vectors are built from real MiniLM embeddings of a pool of texts, each item a
normalised mix of two pool vectors plus noise: embedding 15,000 texts would take minutes on
two cores and measure the model, not retrieval. The unseen-observation path (which embeds at
query time, with the real model) is reported separately as inproc_miss_p50_ms.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import tempfile
import time

import numpy as np

from library.clusters import Cluster
from library.embedding import Embedder
from library.experience import LEVELS, STRATEGY, WARNING, Experience
from library.persistence import snapshot_text
from library.retrieval import retrieve_batch
from library.state import Library
from library.sync import Publisher
from slea.channels import LIBRARY_APP
from slea.config import SleaConfig

TASK_TYPE = "pick_and_place"
POOL = 256  # texts really embedded to make the library's vectors from


def _observation(index: int) -> str:
    return (
        f"You are in room {index // 40}. Looking around, you see cabinet {index % 40}, "
        f"a countertop {index % 13} and a drawer {index % 29}; the light is {'on' if index % 2 else 'off'}."
    )


def _mixed_vectors(pool: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    pairs = rng.integers(0, len(pool), size=(count, 2))
    mixed = pool[pairs[:, 0]] + 0.7 * pool[pairs[:, 1]] + 0.05 * rng.standard_normal((count, pool.shape[1]))
    return (mixed / np.linalg.norm(mixed, axis=1, keepdims=True)).astype(np.float32)


def build_library(
    config: SleaConfig, embedder: Embedder, n_experiences: int, n_clusters: int, seed: int = 0
) -> Library:
    """Clusters c0..c{n-1}; experience i is indexed to clusters i//2 and i//2 + 1, even ids are
    strategies and odd ids warnings, so every cluster holds 2 of each (k=2/1 without fallback)."""
    rng = np.random.default_rng(seed)
    pool = embedder.embed([_observation(i * 7919) + f" pool {i}" for i in range(POOL)])
    library = Library(config.library, embedder)
    centroids = _mixed_vectors(pool, n_clusters, rng)
    clusters = [
        Cluster(
            f"{TASK_TYPE}/c{c}",
            TASK_TYPE,
            library.task_clusters(TASK_TYPE).key_of(_observation(c)),
            _observation(c),
            centroids[c],
            visits=1,
        )
        for c in range(n_clusters)
    ]
    vectors = _mixed_vectors(pool, n_experiences, rng)
    experiences = []
    for i in range(n_experiences):
        zone = STRATEGY if i % 2 == 0 else WARNING
        text = f"Lesson {i}: in room {(i // 2) // 40}, check cabinet {(i // 2) % 40} before the drawer."
        experiences.append(
            Experience(
                id=f"x{n_clusters + i}",
                zone=zone,
                level=LEVELS[zone][i % 3],
                task_type=TASK_TYPE,
                text=text,
                cue=text[:40],
                clusters=[f"{TASK_TYPE}/c{(i // 2) % n_clusters}", f"{TASK_TYPE}/c{(i // 2 + 1) % n_clusters}"],
                score=float(rng.random()),
                tokens=embedder.count_tokens(text),
                embedding=vectors[i],
            )
        )
    header = {"version": 1, "learner_version": 0, "next_id": n_clusters + n_experiences, "counters": {}}
    library.load(header, clusters, experiences)
    return library


def _percentiles(samples: list[float]) -> tuple[float, float]:
    return float(np.percentile(samples, 50)) * 1000, float(np.percentile(samples, 99)) * 1000


def _timed(call, batches: list[list[str]]) -> list[float]:
    call(batches[0])  # warm-up: first-call costs are not what actors see
    samples = []
    for batch in batches:
        started = time.perf_counter()
        call(batch)
        samples.append(time.perf_counter() - started)
    return samples


def bench_retrieval(
    n_experiences: int = 10_000,
    n_clusters: int = 5_000,
    batch_size: int = 32,
    batches: int = 200,
    redis_url: str | None = None,
    http_port: int = 8765,
    seed: int = 0,
) -> dict:
    """Measure the three retrieval paths; starts Redis/Ray/Serve if needed and stops what it started."""
    import ray
    from ray import serve

    from library.service import start_serve_app
    from slea.embedded_redis import EmbeddedRedis
    from slea.redis_conn import connect

    level_capacity = n_experiences  # nothing in the benchmark library may be evicted
    config = SleaConfig.model_validate(
        {
            "run": {"id": f"bench-retrieval-{os.getpid()}"},
            "library": {
                "warmup_versions": 0,
                "warmup_experiences": 0,
                "max_clusters": max(n_clusters, 1),
                "strategy_capacity": dict.fromkeys(LEVELS[STRATEGY], level_capacity),
                "warning_capacity": dict.fromkeys(LEVELS[WARNING], level_capacity),
                "replicas": 1,
                "max_replicas": 1,
                "http_port": http_port,
            },
        }
    )
    embedder = Embedder(cache_size=config.library.embedding_cache_size)
    library = build_library(config, embedder, n_experiences, n_clusters, seed)
    picker = random.Random(seed)
    known = [[_observation(picker.randrange(n_clusters)) for _ in range(batch_size)] for _ in range(batches)]
    unseen = [
        [f"A room never seen before, number {seed}-{b}-{i}: a shelf {i} and a sofa." for i in range(batch_size)]
        for b in range(4)
    ]
    task_types = [TASK_TYPE] * batch_size

    inproc = _timed(lambda batch: retrieve_batch(library, batch, task_types), known)
    miss = _timed(lambda batch: retrieve_batch(library, batch, task_types), unseen)

    server = None
    started_ray = not ray.is_initialized()
    try:
        if redis_url is None:
            server = EmbeddedRedis(tempfile.mkdtemp(prefix="slea-bench-redis-"), appendonly=False).start()
            redis_url = server.url
        Publisher(connect(config.redis, redis_url), config.run.id).start(snapshot_text(library, []))
        if started_ray:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        handle = start_serve_app(config, redis_url)
        request = lambda batch: {"observations": batch, "task_types": task_types}  # noqa: E731
        via_handle = _timed(lambda batch: handle.retrieve_batch.remote(request(batch)).result(), known)
        connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)

        def over_http(batch):
            connection.request(
                "POST", "/retrieve_batch", body=json.dumps(request(batch)), headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")

        via_http = _timed(over_http, known)
        connection.close()
        serve.delete(LIBRARY_APP)
    finally:
        if started_ray:
            serve.shutdown()
            ray.shutdown()
        if server is not None:
            server.stop()
    inproc_p50, inproc_p99 = _percentiles(inproc)
    handle_p50, handle_p99 = _percentiles(via_handle)
    http_p50, http_p99 = _percentiles(via_http)
    return {
        "experiences": n_experiences,
        "clusters": n_clusters,
        "batch_size": batch_size,
        "batches": batches,
        "inproc_p50_ms": round(inproc_p50, 3),
        "inproc_p99_ms": round(inproc_p99, 3),
        "inproc_miss_p50_ms": round(_percentiles(miss)[0], 3),
        "handle_p50_ms": round(handle_p50, 3),
        "handle_p99_ms": round(handle_p99, 3),
        "http_p50_ms": round(http_p50, 3),
        "http_p99_ms": round(http_p99, 3),
        "ratio": round(handle_p50 / inproc_p50, 2),
        "target_handle_p99_ms": 20.0,
        "meets_target": handle_p99 < 20.0,
    }
