"""Names by which components find each other: the Ray namespace, the weight registry actor, the
library's Serve app, a running driver's pool control and the Redis keys beside the step stream. Actors, learner and library
never import each other, so the names they meet by live here."""

from __future__ import annotations

RAY_NAMESPACE = "slea"
LIBRARY_APP = "slea-library"


class LibraryNotPublished(RuntimeError):
    """The library app is up but no writer has published a library for its run yet: replicas
    answer this (HTTP 503 with the reason) until the first snapshot; actors go without experiences."""


# Redis string holding the id of the newest run that `slea train` started with a library on this
# Redis: a library app set to `library.follow: current` (the RayService) serves that run's library.
CURRENT_LIBRARY_RUN_KEY = "slea:current_library_run"


def weight_registry_name(run_id: str) -> str:
    """Ray actor name of a run's weight registry (the learner publishes, actors poll)."""
    return f"slea-weights-{run_id}"


def policy_version_key(run_id: str) -> str:
    """Redis string holding the newest policy version the learner has published: the version line's
    record that outlives the Ray cluster (the weight registry does not), so a learner started on a
    new cluster never re-issues a version the stream's records already carry."""
    return f"slea:{run_id}:policy_version"


def inflight_key(run_id: str, worker_index: int) -> str:
    """Redis hash of the episodes an actor worker has in flight (episode id -> abandon marker
    fields), so that a restarted or removed worker's half episodes can be marked abandoned."""
    return f"slea:{run_id}:inflight:{worker_index}"


def inflight_pattern(run_id: str) -> str:
    """SCAN pattern of every actor worker's in-flight hash of a run, past and present workers alike."""
    return f"slea:{run_id}:inflight:*"


def sync_claims_key(run_id: str) -> str:
    """Redis hash of groups started per policy version (version -> count) in synchronous mode,
    shared by all workers so that exactly `learner.tasks_per_step` groups play each version."""
    return f"slea:{run_id}:sync_claims"


def run_control_name(run_id: str) -> str:
    """Ray actor name of a running driver's pool control (`slea scale` sets the actor pool size there)."""
    return f"slea-control-{run_id}"
