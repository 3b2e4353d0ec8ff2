"""Services a run needs beside its own components: the Redis server and the run directory."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from slea.config import SleaConfig, dump_config
from slea.embedded_redis import EmbeddedRedis

STREAM_GROUPS = ("learner", "library")


def prepare_run_dir(config: SleaConfig, resume_dir: str | None = None) -> Path:
    """runs/<id>-<timestamp>/ with the resolved config; --resume reuses the given directory."""
    if resume_dir is not None:
        run_dir = Path(resume_dir)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
        return run_dir
    run_dir = Path(config.run.dir) / f"{config.run.id}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "config.yaml").write_text(dump_config(config))
    return run_dir


@contextlib.contextmanager
def redis_for_run(config: SleaConfig, run_dir: Path) -> Iterator[str]:
    """The configured Redis URL, or a private redis-server (data in the run dir, so --resume finds
    the stream again) that is stopped however the block ends: normally, on error or on Ctrl-C."""
    if config.redis.url:
        yield config.redis.url
        return
    server = EmbeddedRedis(run_dir / "redis", appendonly=config.redis.embedded_appendonly).start()
    try:
        yield server.url
    finally:
        server.stop(remove_data=False)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Kubernetes and Ray stop processes with SIGTERM; treat it like Ctrl-C so cleanup runs."""

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
