"""The learner as a Ray actor, so `slea train` can place it on its own (GPU) worker group."""

from __future__ import annotations

import threading

import ray

from slea.config import SleaConfig


@ray.remote(max_concurrency=4)
class LearnerProcess:
    """Runs the Learner loop on a thread; the driver drains its metrics and can stop it."""

    def __init__(self, config: dict):
        from learner.learner import Learner

        self.learner = Learner(SleaConfig.model_validate(config))
        self._metrics: list[dict] = []
        self._lock = threading.Lock()
        self.error: str | None = None

    def run(self) -> int:
        """Train to learner.max_steps (or stop()); returns the last published version."""
        try:
            self.learner.run(on_metrics=self._collect)
        except Exception as exc:
            self.error = repr(exc)
            raise
        return self.learner.version

    def _collect(self, metrics: dict) -> None:
        with self._lock:
            self._metrics.append(metrics)

    def drain_metrics(self) -> list[dict]:
        with self._lock:
            drained, self._metrics = self._metrics, []
        return drained

    def version(self) -> int:
        return self.learner.version

    def stop(self) -> None:
        """Finish the current step, checkpoint, return from run()."""
        self.learner.stop_requested.set()
