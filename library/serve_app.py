"""The retrieval app on Ray Serve: handle methods for actors, HTTP JSON for everything else.

Each replica holds a copy of the library that follows the writer through Redis
(library.sync) and is brought up to date before every answer. Bad requests (malformed JSON,
wrong types, out-of-bounds k or budgets, oversized bodies) get a 4xx with a message; a
replica never dies of a request.

A replica needs no library to start: the app comes up (and a RayService becomes ready) before
any writer has published, answers /healthz, and answers retrievals with 503 "no library
published yet for run X" (handle calls raise slea.channels.LibraryNotPublished, which actors
count as the library being unavailable) until the first snapshot, then serves it.
"""

# No `from __future__ import annotations` here: FastAPI must see the real `Request` type in route signatures.

import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from library.embedding import Embedder
from library.persistence import describe_snapshot, snapshot_text
from library.request_models import BadRequest, RetrieveBatchRequest, RetrieveRequest, parse_request
from library.retrieval import retrieve_batch
from library.state import Library
from library.sync import Follower
from slea.channels import LibraryNotPublished
from slea.config import SleaConfig, load_config
from slea.cpu_threads import use_assigned_cpus
from slea.gpu_visibility import gpu_options
from slea.redis_conn import connect

log = logging.getLogger(__name__)

http_app = FastAPI(title="slea experience library")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@serve.deployment
@serve.ingress(http_app)
class LibraryServer:
    """One replica: a followed Library plus the embedding model."""

    def __init__(self, config: dict, redis_url: str):
        use_assigned_cpus()
        self.config = SleaConfig.model_validate(config)
        self.cfg = self.config.library
        self.library = Library(self.cfg, Embedder(self.cfg.embedding_model, self.cfg.embedding_cache_size))
        self.follower = Follower(
            connect(self.config.redis, redis_url), self.config.run.id, self.library, self.cfg.follow == "current"
        )
        try:
            self.follower.sync()  # load the library now if there is one, so the first answer is quick
        except LibraryNotPublished as exc:
            log.info("replica up before any library: %s", exc)
        self.started_at = time.time()

    # ---- handle methods (actors) ---------------------------------------------------------------

    def retrieve(self, request: dict) -> dict:
        """One observation: {"observation", "task_type", "k_strategies"?, "k_warnings"?, "max_tokens"?, "mode"?}."""
        parsed = parse_request(RetrieveRequest, request, self.cfg)
        return self._answer([parsed.observation], [parsed.task_type], parsed)[0]

    def retrieve_batch(self, request: dict) -> list[dict]:
        """Many observations: {"observations": [...], "task_types": [...], ...}; one answer each."""
        parsed = parse_request(RetrieveBatchRequest, request, self.cfg)
        return self._answer(parsed.observations, parsed.task_types, parsed)

    def stats(self) -> dict:
        library = self.library
        self.follower.sync()
        with library.lock:
            return {
                "run": self.follower.run_id,
                "library_version": library.version,
                "learner_version": library.learner_version,
                "warm": library.is_warm(),
                "experiences": {f"{zone}/{level}": size for (zone, level), size in library.level_sizes().items()},
                "clusters": {task_type: len(space) for task_type, space in library.clusters.items()},
                "counters": dict(library.counters),
            }

    def listing(self, top: int = 3) -> str:
        """`slea library show` of the library this replica serves now: the evaluator keeps one beside
        each report it plays with the library (disk snapshots lag the live library by up to
        library.snapshot_every versions)."""
        self.follower.sync()
        title = f"live library of run {self.follower.run_id} (version {self.library.version})"
        return describe_snapshot(snapshot_text(self.library, []), title, top)

    def healthz(self) -> dict:
        """The replica is up; library_version is null while no library is published."""
        try:
            version = self.follower.sync()
        except LibraryNotPublished:
            version = None
        return {
            "ok": True,
            "run": self.follower.run_id,
            "library_version": version,
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def _answer(self, observations: list[str], task_types: list[str], parsed) -> list[dict]:
        self.follower.sync()
        return retrieve_batch(
            self.library,
            observations,
            task_types,
            parsed.k_strategies,
            parsed.k_warnings,
            parsed.max_tokens,
            parsed.mode,
        )

    # ---- HTTP routes -----------------------------------------------------------------------------

    @http_app.post("/retrieve")
    async def http_retrieve(self, request: Request) -> JSONResponse:
        return await self._http(request, self.retrieve)

    @http_app.post("/retrieve_batch")
    async def http_retrieve_batch(self, request: Request) -> JSONResponse:
        return await self._http(request, lambda body: {"results": self.retrieve_batch(body)})

    @http_app.get("/stats")
    async def http_stats(self) -> JSONResponse:
        return await self._guarded(self.stats)

    @http_app.get("/healthz")
    async def http_healthz(self) -> JSONResponse:
        return await self._guarded(self.healthz)

    async def _http(self, request: Request, answer) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.cfg.max_request_bytes:
            return _error(413, f"body of {declared} bytes; at most {self.cfg.max_request_bytes}")
        body = bytearray()
        async for chunk in request.stream():  # bounded even when the client sends no length
            body += chunk
            if len(body) > self.cfg.max_request_bytes:
                return _error(413, f"body larger than {self.cfg.max_request_bytes} bytes")
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"body is not valid JSON: {exc}")
        return await self._guarded(lambda: answer(payload))

    async def _guarded(self, call) -> JSONResponse:
        try:
            return JSONResponse(call())
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        except LibraryNotPublished as exc:  # expected until the writer's first snapshot: no traceback
            return _error(503, str(exc))
        except Exception as exc:  # e.g. Redis gone: say so, keep the replica
            log.exception("library request failed")
            return _error(503, f"library unavailable: {exc}")


def build_app(config: SleaConfig, redis_url: str):
    """The Serve application for a run, with replicas and autoscaling from LibraryConfig."""
    cfg = config.library
    # Bounded: a replica works on max_ongoing_requests at once and each caller queues at most
    # max_queued_requests more; beyond that Serve answers 503 "dropped due to backpressure"
    # instead of queueing without limit until memory or latency gives out.
    options: dict = {
        "ray_actor_options": {"num_cpus": 1, "resources": dict(cfg.resources), **gpu_options(0)},  # CPU replicas
        "max_ongoing_requests": cfg.max_ongoing_requests,
        "max_queued_requests": cfg.max_queued_requests,
    }
    if cfg.max_replicas > cfg.replicas:
        options["autoscaling_config"] = {
            "min_replicas": cfg.replicas,
            "max_replicas": cfg.max_replicas,
            "target_ongoing_requests": cfg.target_ongoing_requests,
        }
    else:
        options["num_replicas"] = cfg.replicas
    return LibraryServer.options(**options).bind(config.model_dump(mode="json"), redis_url)


def app_builder(args: dict):
    """Serve application builder for RayService / `serve run` (serveConfigV2 import_path):
    args {"config": path of the run YAML, "overrides": ["key=value", ...]}; Redis from the config."""
    config = load_config(args["config"], args.get("overrides", []))
    if not config.redis.url:
        raise ValueError(f"{args['config']}: redis.url must be set to serve a library on its own")
    return build_app(config, config.redis.url)
