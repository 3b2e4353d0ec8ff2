"""One place that turns a catalogue name (monitoring/catalogue.py) into a live metric:
prometheus-client outside Ray, Ray's metrics agent inside it (monitoring/ray_metrics.py).

Components never construct prometheus metrics themselves; they call `metric(name)`.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from monitoring.catalogue import CATALOGUE, PREFIX
from monitoring.ray_metrics import ray_backend_active, ray_metric

_lock = threading.Lock()
_live: dict[tuple[str, int], object] = {}


def metric(name: str, registry: CollectorRegistry = REGISTRY):
    """The live metric for a catalogue name: prometheus-client (created once per registry), or
    inside Ray a ray.util.metrics wrapper with the same labels()/inc()/set()/observe() surface."""
    spec = CATALOGUE.get(name)
    if spec is None:
        raise KeyError(f"metric '{name}' is not defined in monitoring/catalogue.py")
    if registry is REGISTRY and ray_backend_active():
        return ray_metric(spec)
    key = (name, id(registry))
    with _lock:
        live = _live.get(key)
        if live is None:
            full_name = PREFIX + name
            if spec.kind == "counter":
                live = Counter(full_name.removesuffix("_total"), spec.help, spec.labels, registry=registry)
            elif spec.kind == "gauge":
                live = Gauge(full_name, spec.help, spec.labels, registry=registry)
            else:
                live = Histogram(full_name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)
            _live[key] = live
    return live


def serve_metrics(port: int, address: str = "127.0.0.1") -> int:
    """Expose the default registry on an HTTP port (outside Ray); returns the bound port. Loopback
    unless told otherwise (monitoring.metrics_host): metrics name runs and hosts."""
    server, _thread = start_http_server(port, addr=address)
    return server.server_port
