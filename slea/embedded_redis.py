"""A private redis-server for one-machine runs and tests, started and stopped by slea itself.

Loopback only, on a free port, with its own data directory; AOF on by default so a
restarted server (fault-tolerance tests, `slea train --resume`) keeps every acknowledged step.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from slea.ports import free_port

INSTALL_HINT = (
    "redis-server is not on PATH: install it (Debian/Ubuntu: sudo apt-get install redis-server) "
    "or set redis.url to a running server"
)


class RedisServerMissing(RuntimeError):
    """No redis-server binary to start an embedded server with."""


class EmbeddedRedis:
    """`with EmbeddedRedis() as server: server.url` — the server lives exactly as long as the block."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        appendonly: bool = True,
        port: int | None = None,
        extra_args: list[str] = (),
    ):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerMissing(INSTALL_HINT)
        self.binary = binary
        self._owned_dir = data_dir is None
        # Absolute: redis-server chdirs into --dir before it opens --logfile and the AOF.
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="slea-redis-")).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.port = port or free_port()
        self.extra_args = list(extra_args)  # more redis-server options, e.g. a TLS port beside the plain one (tests)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.data_dir / "redis.log"),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode(errors="replace").strip() if self.process.stderr else ""
                log = self.data_dir / "redis.log"
                detail = error or (log.read_text()[-500:] if log.exists() else "")
                raise RuntimeError(f"redis-server exited with code {self.process.returncode}: {detail}")
            try:
                if client.ping():
                    return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s:.0f}s")

    def stop(self, remove_data: bool | None = None) -> None:
        """Shut down (AOF is flushed by a graceful SIGTERM); remove a temp data dir we created."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if remove_data if remove_data is not None else self._owned_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self) -> None:
        """Stop and start on the same port and data dir (what a crashed-and-restarted Redis looks like)."""
        self.stop(remove_data=False)
        self.start()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
