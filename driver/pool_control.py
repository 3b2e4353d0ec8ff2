"""The size of a running driver's actor pool: asked for by `slea scale` or the autoscaler, applied
by the driver's loop, while the learner and the library go on untouched.

The desired size lives in a small named Ray actor, RunControl (`run_control_name(run id)`), that
the driver starts and owns: not detached, so it dies with the driver, and finding it means the run
is going. The driver writes the Ray address it joined into `<run dir>/driver.json`, so `slea scale
runs/<id>` finds the cluster; with a bare run id it joins `--address` (auto on a KubeRay head).
Every poll the driver reads the desired size, resizes the pool if it changed (ActorPool.scale
waits for neither new nor removed workers), and exports desired and alive worker counts; with
`actors.autoscale` it also decides a size every `interval_s` (driver/autoscale.py).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from driver.autoscale import PoolSignals, decide, throttled_fraction
from monitoring.metrics import metric
from slea.channels import RAY_NAMESPACE, run_control_name
from slea.config import SleaConfig

DRIVER_FILE = "driver.json"  # in the run directory while its driver runs: run id, Ray address, pid, host


@ray.remote(num_cpus=0, max_restarts=0)
class RunControl:
    """The desired actor pool size of one running `slea train`, and what the driver last reported."""

    def __init__(self, desired: int, bounds: tuple[int, int] | None):
        self.desired = desired
        self.alive = 0  # workers up, as the driver last reported
        self.bounds = bounds  # actors.autoscale's (min_workers, max_workers); None: the size is fixed

    def request(self, workers: int) -> dict:
        """`slea scale`: ask for `workers`; returns what changed, or an error within autoscale bounds."""
        if self.bounds is not None and not self.bounds[0] <= workers <= self.bounds[1]:
            low, high = self.bounds
            return {
                "error": f"actors.autoscale keeps this run between {low} and {high} workers: ask for a size in that range"
            }
        previous, self.desired = self.desired, workers
        return {"previous": previous, "desired": workers, "alive": self.alive, "autoscale": self.bounds is not None}

    def exchange(self, alive: int) -> int:
        """The driver, every poll: report the workers up, read the desired size."""
        self.alive = alive
        return self.desired

    def autoscale(self, expected: int, workers: int) -> bool:
        """The driver's autoscaler: set `workers` unless `slea scale` changed the size since it looked."""
        if self.desired != expected:
            return False
        self.desired = workers
        return True


class PoolSizer:
    """The driver's side: the control actor, driver.json, and the pool size applied every poll."""

    def __init__(self, config: SleaConfig, run_dir: Path, say: Callable[[str], None]):
        self.pool = None  # the ActorPool, from start() on
        self.say = say  # one line to the driver's console
        self.policy = config.actors.autoscale
        self.driver_file = Path(run_dir) / DRIVER_FILE
        initial = config.actors.num_workers
        bounds = None
        if self.policy is not None:
            bounds = (self.policy.min_workers, self.policy.max_workers)
            initial = min(max(initial, bounds[0]), bounds[1])
        try:
            self.control = RunControl.options(
                name=run_control_name(config.run.id),
                namespace=RAY_NAMESPACE,
                # The driver's own node: the control must not sit on an actor node the autoscaler removes.
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
            ).remote(initial, bounds)
        except ray.exceptions.ActorAlreadyExistsError:  # a driver of this run id is on this cluster already
            raise FileExistsError(
                f"run '{config.run.id}' is already being trained on this Ray cluster "
                f"(named actor {run_control_name(config.run.id)}): choose another run.id"
            ) from None
        self.driver_file.write_text(
            json.dumps(
                {
                    "run_id": config.run.id,
                    "ray_address": ray.get_runtime_context().gcs_address,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                }
            )
            + "\n"
        )
        self.applied = 0  # the size last passed to pool.scale

    def start(self, pool) -> None:
        """Start the pool at its first size: actors.num_workers (within actors.autoscale's bounds), or
        what `slea scale` asked for while the learner and library were starting."""
        self.pool = pool
        self.applied = ray.get(self.control.exchange.remote(0))
        pool.scale(self.applied)
        self._open_window()
        self._export()

    def _open_window(self, summaries: list[dict] = ()) -> None:
        """Start an autoscale interval: the learner's steps and the workers' throttling since now."""
        self._window_started = time.monotonic()
        self._throttled_before = held_back_seconds(summaries)
        self._steps = 0
        self._wait_s = self._train_s = 0.0

    def update(self, summaries: list[dict], learner_steps: list[dict]) -> None:
        """One driver poll: the pool's latest summaries and the learner steps drained since the last poll."""
        self._steps += len(learner_steps)
        self._wait_s += sum(step.get("wait_seconds", 0.0) for step in learner_steps)
        self._train_s += sum(step.get("step_seconds", 0.0) for step in learner_steps)
        desired = ray.get(self.control.exchange.remote(self.pool.alive))
        if desired != self.applied:
            self.say(f"actor pool: {self.applied} -> {desired} workers (slea scale)")
            self._apply(desired)
            self._open_window(summaries)  # the next decision looks at the new size only
        elif self.policy is not None and time.monotonic() - self._window_started >= self.policy.interval_s:
            self._autoscale(summaries)
        self._export()

    def _autoscale(self, summaries: list[dict]) -> None:
        seconds = time.monotonic() - self._window_started
        throttled_after = held_back_seconds(summaries)
        decision = decide(
            PoolSignals(
                desired=self.applied,
                alive=self.pool.alive,
                learner_steps=self._steps,
                learner_wait_s=self._wait_s,
                learner_train_s=self._train_s,
                throttled_fraction=throttled_fraction(self._throttled_before, throttled_after, seconds),
            ),
            self.policy,
        )
        metric("actor_pool_autoscale_decisions_total").labels(kind=decision.kind).inc()
        if decision.workers != self.applied and ray.get(self.control.autoscale.remote(self.applied, decision.workers)):
            self.say(f"actor pool: {self.applied} -> {decision.workers} workers (autoscale: {decision.reason})")
            self._apply(decision.workers)
        self._open_window(summaries)

    def _apply(self, workers: int) -> None:
        self.pool.scale(workers)
        self.applied = workers

    def _export(self) -> None:
        metric("actor_pool_desired_workers").set(self.applied)
        metric("actor_pool_alive_workers").set(self.pool.alive)

    def close(self) -> None:
        """The run is ending: `slea scale` must find it gone from now on."""
        self.driver_file.unlink(missing_ok=True)
        ray.kill(self.control)


def held_back_seconds(summaries: list[dict]) -> dict[int, float]:
    """Each worker's seconds held back by its gate, less those at the run's end (the updates left until
    learner.max_steps had their groups): a pool that is done is not too large, and counting them shrank
    a pool that had just grown for a learner waiting on it (tests/driver/test_cli_plugins.py)."""
    return {summary["worker"]: summary["throttled_s"] - summary["run_end_s"] for summary in summaries}
