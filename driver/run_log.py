"""The attempt's log in the run directory: <run dir>/logs/<UTC start>-<host>/driver.log holds what
`slea train` prints (plain text, each line with its UTC time), the warnings the driver process
logs, and the traceback that ends a failed attempt. The console shows what it always showed; the
file outlives the pod. On a cluster the run directory is on the run-state claim, while KubeRay
deletes a failed attempt's pods, and `kubectl logs` with them, as soon as it retries the RayJob
(backoffLimit) and ttlSecondsAfterFinished after the last attempt. The host is the head pod's
name, so each attempt gets its own directory (docs/runbook.md, "Reading a failed attempt")."""

from __future__ import annotations

import logging
import socket
import traceback
from datetime import UTC, datetime
from pathlib import Path

from rich.text import Text

LOGS_DIR = "logs"
# the driver-side packages whose warnings go into the file (the driver runs the actor pool's supervisor)
LOGGED_PACKAGES = ("driver", "actors", "learner", "library", "slea")


class AttemptLog:
    """driver.log of one attempt; `close` detaches it from logging."""

    def __init__(self, run_dir: Path, host: str | None = None):
        started = datetime.now(UTC)
        self.dir = Path(run_dir) / LOGS_DIR / f"{started:%Y%m%dT%H%M%SZ}-{host or socket.gethostname()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "driver.log"
        self._file = self.path.open("a", encoding="utf-8", buffering=1)  # line-buffered: a killed pod keeps its lines
        handler = logging.StreamHandler(self._file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        # A record with no handler anywhere goes to logging's lastResort (stderr, WARNING and up): once
        # these loggers have the file's handler, they need lastResort as well, or the console loses them.
        self._handlers = [handler]
        if not logging.getLogger().handlers and logging.lastResort is not None:
            self._handlers.append(logging.lastResort)
        for name in LOGGED_PACKAGES:
            for each in self._handlers:
                logging.getLogger(name).addHandler(each)

    def write(self, markup: str) -> None:
        """One line, rich markup removed, after its UTC time."""
        self._file.write(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {Text.from_markup(markup).plain}\n")

    def failure(self, exc: BaseException) -> None:
        self.write(f"slea train failed: {type(exc).__name__}: {exc}")
        self._file.write("".join(traceback.format_exception(exc)))

    def close(self) -> None:
        for name in LOGGED_PACKAGES:
            for each in self._handlers:
                logging.getLogger(name).removeHandler(each)
        self._file.close()
