"""Services a run needs beside its own components: the Redis server and the run directory."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slea.config import SleaConfig, dump_config
from slea.embedded_redis import EmbeddedRedis
from slea.redis_conn import connect

STREAM_GROUPS = ("learner", "library")


def stream_groups(config: SleaConfig) -> tuple[str, ...]:
    """The consumer groups a run reads: the learner's always, the library writer's only with a library
    (a `grpo` run has none). Only these are created: the driver trims what every group acknowledged,
    so a group nobody reads would keep the whole stream until Redis is full."""
    return STREAM_GROUPS if config.library.enabled else ("learner",)


class RunExists(FileExistsError):
    """A new run would land on an existing one (its directory, or its stream in an external Redis):
    starting it would silently merge two runs' steps, checkpoints and library."""


def prepare_run_dir(config: SleaConfig, resume_dir: str | None = None) -> Path:
    """<run.dir>/<run.id>/ with the resolved config. Every component (learner checkpoints, library
    snapshots, the embedded Redis data) finds the run there by its id; a new run refuses an
    existing directory or an existing stream (checked before anything is written), --resume
    requires the directory."""
    run_dir = Path(config.run.dir) / config.run.id
    if resume_dir is not None:
        if not (Path(resume_dir) / "config.yaml").is_file():
            raise FileNotFoundError(f"{resume_dir} is not a run directory (no config.yaml)")
        if Path(resume_dir).resolve() != run_dir.resolve():
            raise FileNotFoundError(f"{resume_dir} holds run '{config.run.id}' at {run_dir}; resume it from there")
        return run_dir
    another_id = "or choose another run.id (--set run.id=...)"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunExists(f"run directory {run_dir} exists: continue it with --resume {run_dir}, {another_id}")
    if config.redis.url:  # an embedded Redis lives in the run directory, which is new
        client = connect(config.redis)
        try:
            taken = client.exists(config.stream_key())
        finally:
            client.close()
        if taken:
            raise RunExists(
                f"run '{config.run.id}' already has a stream ({config.stream_key()}) in the configured Redis: "
                f"continue that run with --resume <its run directory>, {another_id}"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
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


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def interrupt_on_sigterm() -> Any:
    """SIGTERM raises KeyboardInterrupt from here on, as Ctrl-C does; returns the handler it
    replaced. `ray.init()` installs its own SIGTERM handler (sys.exit, and in a Ray job's driver
    an abort: exit 134 before any cleanup), so a driver calls this again once it has joined Ray."""
    return signal.signal(signal.SIGTERM, _interrupt)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Kubernetes and Ray stop processes with SIGTERM; treat it like Ctrl-C so cleanup runs."""
    previous = interrupt_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
