"""Metrics inside Ray: the same `metric(name)` surface, exported through Ray's metrics agent.

Why: one Ray node runs many worker processes (actor workers, the learner, Serve replicas). If
each opened a prometheus-client HTTP port they would collide, and Prometheus would have to
discover ports per process. Ray already runs one metrics agent per node on the node's metrics
export port (KubeRay: 8080, container port `metrics`), and `ray.util.metrics` records into it.

Ray exports these as `ray_<name>` and adds labels of its own (WorkerId, NodeAddress,
SessionName, Component, Version, otel_scope_*). The shipped scrape configs
(monitoring/prometheus/) rename `ray_slea_*` back to `slea_*` and drop the otel_scope labels, so
dashboards and alerts use one name wherever a component ran. WorkerId keeps the series of two
actors on one node apart, which is also why a gauge here is per process.

A Ray gauge is exported only in the report interval it was set in, and the agent drops it 2
intervals later (Ray 2.60: 20 s by default): a gauge set once per learner step vanished between
steps, so the learner's and the library's panels were empty most of the time (issue 39). Every
gauge series this process set is therefore set again every REFRESH_S by one daemon thread.

The backend is chosen by where the code runs: inside a Ray worker process (actor, task, Serve
replica) `monitoring.metrics.metric` returns these wrappers automatically; a driver that wants its
metrics on the node agent too calls `use_ray_metrics()` after `ray.init`, before it creates the
components that hold metrics.
"""

from __future__ import annotations

import sys
import threading
import time

from monitoring.catalogue import PREFIX, MetricSpec

_lock = threading.Lock()
_live: dict[str, _Series] = {}
_chosen = False  # set by use_ray_metrics() in a driver
_worker_mode: bool | None = None  # cached once Ray is up: a process never changes between driver and worker
_refresher: threading.Thread | None = None  # started by the first gauge set
REFRESH_S = 1.0  # Ray exports at most once a second and keeps a gauge 2 report intervals


def use_ray_metrics() -> None:
    """Send this process's metrics to Ray's node metrics agent (drivers; workers switch on their own)."""
    global _chosen
    import ray

    if not ray.is_initialized():
        raise RuntimeError("use_ray_metrics() needs a running Ray: call it after ray.init()")
    _chosen = True


def ray_backend_active() -> bool:
    """True in a Ray worker process, or in a driver that called use_ray_metrics()."""
    global _worker_mode
    if _chosen:
        return True
    if _worker_mode is None:
        ray = sys.modules.get("ray")  # never import Ray just to find out we are not in it
        if ray is None or not ray.is_initialized():
            return False
        _worker_mode = ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    return _worker_mode


def ray_metric(spec: MetricSpec) -> _Series:
    """The Ray-backed metric for a catalogue entry (created once per process)."""
    with _lock:
        live = _live.get(spec.name)
        if live is None:
            live = _KINDS[spec.kind](spec, _build(spec), tags=None, values={})
            _live[spec.name] = live
    return live


def _build(spec: MetricSpec):
    from ray.util import metrics as ray_metrics

    # Counters keep their _total name: Ray's exporter does not add a second suffix.
    name = PREFIX + spec.name
    if spec.kind == "counter":
        return ray_metrics.Counter(name, spec.help, tag_keys=spec.labels)
    if spec.kind == "gauge":
        return ray_metrics.Gauge(name, spec.help, tag_keys=spec.labels)
    return ray_metrics.Histogram(name, spec.help, boundaries=list(spec.buckets), tag_keys=spec.labels)


class _Series:
    """A metric, or one labelled series of it, with prometheus-client's `labels()` contract."""

    def __init__(self, spec: MetricSpec, backend, tags: dict[str, str] | None, values: dict):
        self._spec = spec
        self._backend = backend
        self._tags = tags
        self._values = values  # gauges: last value per series, shared by all children of one metric

    def labels(self, *values, **named) -> _Series:
        spec = self._spec
        if not spec.labels:
            raise ValueError(f"metric '{spec.name}' has no labels; call inc/set/observe on it directly")
        if self._tags is not None:
            raise ValueError(f"metric '{spec.name}': labels() was already applied")
        if values and named:
            raise ValueError(f"metric '{spec.name}': pass label values by position or by name, not both")
        if values:
            if len(values) != len(spec.labels):
                raise ValueError(f"metric '{spec.name}' takes labels {spec.labels}, got {len(values)} values")
            tags = dict(zip(spec.labels, values))
        else:
            if set(named) != set(spec.labels):
                raise ValueError(f"metric '{spec.name}' takes labels {spec.labels}, got {tuple(named)}")
            tags = named
        return type(self)(spec, self._backend, {key: str(value) for key, value in tags.items()}, self._values)

    def _series_tags(self) -> dict[str, str]:
        if self._spec.labels and self._tags is None:
            raise ValueError(f"metric '{self._spec.name}' needs labels {self._spec.labels}: call .labels(...) first")
        return self._tags or {}


class _Counter(_Series):
    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counter '{self._spec.name}' can only increase (got {amount})")
        if amount:  # prometheus-client accepts inc(0); Ray rejects it, and it changes nothing
            self._backend.inc(float(amount), tags=self._series_tags())


def refresh_gauges() -> None:
    """Set every gauge series this process set again, to its last value (see the module docstring)."""
    with _lock:
        for live in _live.values():
            if isinstance(live, _Gauge):
                for key, value in live._values.items():
                    live._backend.set(value, tags=dict(key))


def _keep_gauges_alive() -> None:
    """Start the refresh thread once (called with _lock held)."""
    global _refresher
    if _refresher is None:

        def loop() -> None:
            while True:
                time.sleep(REFRESH_S)
                refresh_gauges()

        _refresher = threading.Thread(target=loop, name="slea-gauge-refresh", daemon=True)
        _refresher.start()


class _Gauge(_Series):
    def set(self, value: float) -> None:
        tags = self._series_tags()
        with _lock:
            self._values[tuple(sorted(tags.items()))] = float(value)
            self._backend.set(float(value), tags=tags)
            _keep_gauges_alive()

    def inc(self, amount: float = 1.0) -> None:
        tags = self._series_tags()
        key = tuple(sorted(tags.items()))
        with _lock:  # read-modify-write: Ray gauges only know "set"
            value = self._values.get(key, 0.0) + amount
            self._values[key] = value
            self._backend.set(value, tags=tags)
            _keep_gauges_alive()

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)


class _Histogram(_Series):
    def observe(self, value: float) -> None:
        self._backend.observe(float(value), tags=self._series_tags())


_KINDS = {"counter": _Counter, "gauge": _Gauge, "histogram": _Histogram}
