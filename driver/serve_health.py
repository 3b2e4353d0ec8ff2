"""The library's Serve replicas as the driver sees them. Serve's controller, not the driver, heals a
replica that died: its health check fails (or its actor crashed), the deployment reads UNHEALTHY
("A replica's health check failed ...", ray/serve/_private/deployment_state.py
`_stop_replica_mark_unhealthy_if_target_version`) and a new replica starts; the deployment reads
HEALTHY again once it runs. Without a word from the driver that death would be only in the Serve
controller's own log file. So the driver reports both moments the way it reports the restarts it
makes itself (driver/supervision.py): a line in the run's log and one more in
slea_run_component_restarts_total{component="serve_replica"} (alert SleaComponentRestarts).

The UNHEALTHY spell lasts from Serve's health check noticing the death (every 10 s by default) to
the replacement's start (MiniLM loads in seconds), so it is asked about on a thread of its own
every SERVE_POLL_S: the driver's own loop can be held far longer than that (a call into a library
writer that is restarting waits out its timeout), and a chaos run (tests/test_chaos.py) that
polled from that loop missed a whole replacement. A replacement faster than one poll is still not
seen."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from monitoring.metrics import metric

log = logging.getLogger(__name__)
SERVE_POLL_S = 2.0  # one `serve.status()` (one call to Serve's controller) this often
JOIN_TIMEOUT_S = 10.0  # the longest the end of a run waits for the watching thread's last ask
REPLICA_COMPONENT = "serve_replica"  # the component label of slea_run_component_restarts_total


def serve_deployment_statuses(app_name: str) -> dict[str, tuple[str, str]]:
    """Deployment name -> (status, message) of one Serve application; empty when it is not running."""
    from ray import serve

    application = serve.status().applications.get(app_name)
    if application is None:
        return {}
    # DeploymentStatus is a str Enum: its value is "UNHEALTHY", its str() "DeploymentStatus.UNHEALTHY"
    return {name: (overview.status.value, overview.message) for name, overview in application.deployments.items()}


class ServeHealth:
    """Says when a deployment of `app_name` turns UNHEALTHY (a replica failed: counted as a restart)
    and when it is HEALTHY again (the replica was replaced). Statuses come from `statuses`
    (serve_deployment_statuses, or a table in tests)."""

    def __init__(
        self,
        app_name: str,
        say: Callable[[str], None],
        statuses: Callable[[str], dict[str, tuple[str, str]]] = serve_deployment_statuses,
    ):
        self.app_name, self.say, self.statuses = app_name, say, statuses
        self.replaced = 0  # replica failures seen so far
        self._unhealthy: set[str] = set()  # deployments now UNHEALTHY

    def poll(self) -> None:
        try:
            statuses = self.statuses(self.app_name)
        except Exception as exc:  # Serve's controller restarting: it is asked again at the next poll
            log.warning("Serve status unavailable: %s", exc)
            return
        for name, (status, message) in statuses.items():
            if status == "UNHEALTHY" and name not in self._unhealthy:
                self._unhealthy.add(name)
                self.replaced += 1
                metric("run_component_restarts_total").labels(component=REPLICA_COMPONENT).inc()
                self.say(f"[yellow]a Serve replica of {name} failed[/] ({message}): Serve is replacing it")
            elif status == "HEALTHY" and name in self._unhealthy:
                self._unhealthy.discard(name)
                self.say(f"{name} is healthy again: Serve replaced its failed replica")

    @contextlib.contextmanager
    def watching(self, every_s: float = SERVE_POLL_S) -> Iterator[ServeHealth]:
        """poll() every `every_s` on a daemon thread of its own while the block runs, whatever the
        caller's thread is waiting on; the thread asks no more once the block has ended."""
        stopping = threading.Event()

        def watch() -> None:
            while not stopping.wait(every_s):
                self.poll()

        thread = threading.Thread(target=watch, name="slea-serve-health", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stopping.set()
            # an ask in flight ends within Serve's answer; one that hangs (a controller that stopped
            # answering) must not hold the run's shutdown: the thread is a daemon
            thread.join(timeout=JOIN_TIMEOUT_S)
