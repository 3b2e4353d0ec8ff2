"""The library writer as a Ray actor, so `slea train` can place it on its own (CPU) worker group."""

from __future__ import annotations

import threading

import ray

from slea.config import SleaConfig


@ray.remote(max_concurrency=4)
class LibraryProcess:
    """Consumes the stream into the library on a thread; publishes what Serve replicas follow."""

    def __init__(self, config: dict, redis_url: str, run_dir: str):
        from library.service import start_writer
        from slea.cpu_threads import use_assigned_cpus

        use_assigned_cpus()

        self.writer = start_writer(SleaConfig.model_validate(config), redis_url, run_dir)
        self._stop = threading.Event()

    def run(self) -> None:
        """Consume until stop(); then apply the open window, snapshot and acknowledge."""
        self.writer.run(self._stop)

    def stop(self) -> None:
        self._stop.set()

    def stats(self) -> dict:
        library = self.writer.library
        with library.lock:
            return {
                "version": library.version,
                "experiences": {f"{zone}/{level}": size for (zone, level), size in library.level_sizes().items()},
                "clusters": sum(len(space) for space in library.clusters.values()),
                "prompts": {"seen": self.writer.prompts_seen, **self.writer.prompts_showing},
            }
