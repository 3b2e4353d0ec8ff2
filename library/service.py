"""Running the library: the writer (consumer + worker) and the Serve app, for `slea train`
(inside a run) and `slea serve-library` (alone, against a run's stream and directory)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from library.consumer import LibraryWriter
from library.embedding import Embedder
from library.extraction.llm import build_extractor
from library.serve_app import build_app
from library.state import Library
from slea.channels import LIBRARY_APP, RAY_NAMESPACE
from slea.config import SleaConfig
from slea.cpu_threads import worker_environment
from slea.redis_conn import connect

log = logging.getLogger(__name__)


def start_writer(config: SleaConfig, redis_url: str, run_dir: str | Path) -> LibraryWriter:
    """The run's library writer, restored from the run directory's latest snapshot if any.
    Call `writer.run(stop)` on a thread of your choice; it snapshots and acks when stopped."""
    from slea.models import load_tokenizer

    cfg = config.library
    library = Library(cfg, Embedder(cfg.embedding_model, cfg.embedding_cache_size), load_tokenizer(config.model.name))
    return LibraryWriter(
        config, connect(config.redis, redis_url), run_dir, library, build_extractor(cfg, config.model.name)
    )


def start_serve_app(config: SleaConfig, redis_url: str):
    """Deploy the retrieval app (Ray must be initialised; a writer need not have published yet); returns its handle."""
    from ray import serve

    if config.library.http_port:
        serve.start(http_options={"host": config.library.http_host, "port": config.library.http_port})
    else:
        serve.start(proxy_location="Disabled")
    return serve.run(build_app(config, redis_url), name=LIBRARY_APP, route_prefix="/")


def serve_library(config: SleaConfig, run_dir: str | Path | None = None) -> int:
    """`slea serve-library`: writer + Serve app until Ctrl-C or SIGTERM; returns the exit code.

    Needs redis.url (the run's stream); the library lives in <run.dir>/<run.id>/ unless
    `run_dir` says otherwise."""
    import ray
    from ray import serve

    from slea.config import ConfigError
    from slea.services import sigterm_as_interrupt

    if not config.redis.url:
        raise ConfigError("serve-library reads a run's step stream: set redis.url to that run's Redis")
    run_dir = Path(run_dir) if run_dir is not None else Path(config.run.dir) / config.run.id
    ray.init(
        address=config.ray.address,
        num_cpus=config.ray.num_cpus,
        namespace=RAY_NAMESPACE,
        ignore_reinit_error=True,
        runtime_env={"env_vars": worker_environment()},
    )
    stop = threading.Event()
    writer = start_writer(config, config.redis.url, run_dir)
    try:
        with sigterm_as_interrupt():
            start_serve_app(config, config.redis.url)
            log.info("library serving run %s on port %s", config.run.id, config.library.http_port or "(handle only)")
            writer.run(stop)
    except KeyboardInterrupt:
        writer.shutdown()
    finally:
        serve.shutdown()
    return 0
