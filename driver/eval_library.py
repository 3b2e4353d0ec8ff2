"""The experience library an evaluation retrieves from: a running Serve app, or a run's snapshot.

`slea eval` measures a policy with and without the library it was trained beside. That library
is either already being served (a cluster at `ray.address` with the run's app up), or it is the
newest snapshot in the run directory, which is served here for the evaluation's duration (a
private Redis carries it to the Serve replica exactly as the library writer would publish it).
When neither exists the caller gets None and a sentence saying why, which the report prints in
place of the with-library rows.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from actors.retrieval_client import RetrievalClient
from slea.channels import LIBRARY_APP, RAY_NAMESPACE
from slea.config import SleaConfig
from slea.cpu_threads import worker_environment

# Evaluation measures the library's effect, not its latency: a cold replica (embedding model
# warming up) must not turn the first steps into misses.
EVAL_RETRIEVAL_TIMEOUT_S = 30.0


def retrieval_client_for(config: SleaConfig, handle) -> RetrievalClient:
    lib = config.library
    return RetrievalClient(
        k_strategies=lib.k_strategies,
        k_warnings=lib.k_warnings,
        max_tokens=lib.max_tokens,
        timeout_s=max(config.actors.retrieval_timeout_s, EVAL_RETRIEVAL_TIMEOUT_S),
        handle=handle,
    )


def running_library_app():
    """The handle of the library app on the connected Ray cluster, or None if it is not running there."""
    from ray import serve

    application = serve.status().applications.get(LIBRARY_APP)
    if application is None or application.status != "RUNNING":  # ApplicationStatus is a str enum
        return None
    return serve.get_app_handle(LIBRARY_APP)


@contextlib.contextmanager
def _serve_snapshot(config: SleaConfig, snapshot: Path) -> Iterator[object]:
    """Serve `snapshot` on a local Ray for the block: private Redis, published snapshot, one replica."""
    import ray
    from ray import serve

    from library.service import start_serve_app
    from library.sync import Publisher
    from slea.embedded_redis import EmbeddedRedis
    from slea.redis_conn import connect

    local = config.model_copy(deep=True)
    local.redis.url = None
    local.library.http_port = 0  # handle only: no port to collide with a run on this machine
    local.library.replicas = local.library.max_replicas = 1
    with tempfile.TemporaryDirectory(prefix="slea-eval-redis-") as redis_dir:
        server = EmbeddedRedis(Path(redis_dir), appendonly=False).start()
        client = connect(local.redis, server.url)
        try:
            Publisher(client, local.run.id).start(snapshot.read_text())
            ray.init(
                num_cpus=config.ray.num_cpus,
                namespace=RAY_NAMESPACE,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": worker_environment()},
            )
            try:
                yield start_serve_app(local, server.url)
            finally:
                serve.shutdown()
                ray.shutdown()
        finally:
            client.close()
            server.stop()


@contextlib.contextmanager
def eval_library(config: SleaConfig, run_dir: Path | None) -> Iterator[tuple[RetrievalClient | None, str]]:
    """(retrieval client or None, what the library is) for the duration of the block."""
    if not config.library.enabled:
        yield None, "none: this run's config has library.enabled false (preset grpo)"
        return
    import ray

    if config.ray.address or ray.is_initialized():
        # A cluster (or this process's own Ray, e.g. inside `slea train`): use its app or report its
        # absence; never deploy or shut down Serve on Ray this evaluation did not start.
        where = config.ray.address or "this process's Ray"
        connected_here = not ray.is_initialized()
        if connected_here:
            ray.init(address=config.ray.address, namespace=RAY_NAMESPACE, log_to_driver=False)
        try:
            handle = running_library_app()
            if handle is None:
                yield (
                    None,
                    (
                        f"unavailable: no running '{LIBRARY_APP}' app on {where}; start the run's library "
                        "there, or evaluate without ray.address to serve the run's snapshot locally"
                    ),
                )
                return
            client = retrieval_client_for(config, handle)
            try:
                yield client, f"app '{LIBRARY_APP}' running on {where}"
            finally:
                client.close()
        finally:
            if connected_here:
                ray.shutdown()  # disconnects this driver; the cluster and its apps keep running
        return
    snapshot = _latest_snapshot(run_dir) if run_dir is not None else None
    if snapshot is None:
        where = f"run directory {run_dir} has no library snapshot" if run_dir is not None else "no run directory given"
        yield (
            None,
            (
                f"unavailable ({where}): evaluate a run directory or checkpoint of a run with a library "
                f"snapshot, or set ray.address to a cluster serving '{LIBRARY_APP}'"
            ),
        )
        return
    header = json.loads(snapshot.read_text().split("\n", 1)[0])
    with _serve_snapshot(config, snapshot) as handle:
        client = retrieval_client_for(config, handle)
        try:
            yield (
                client,
                (
                    f"snapshot {snapshot} (library version {header['version']}, "
                    f"{header['experiences']} experiences) served for this evaluation"
                ),
            )
        finally:
            client.close()


def _latest_snapshot(run_dir: Path) -> Path | None:
    from library.persistence import latest_snapshot

    return latest_snapshot(run_dir)
