"""Every slea metric: name, type, help and labels in one table, so dashboards and alerts can be
checked against it, and one place that turns a name into a live prometheus-client metric.

Components never construct prometheus metrics themselves; they call `metric(name)`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PREFIX = "slea_"

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric as Prometheus will see it (the exported name is PREFIX + name)."""

    name: str  # without prefix; counters end in _total
    kind: str  # "counter" | "gauge" | "histogram"
    help: str  # one line shown in Prometheus and Grafana
    labels: tuple[str, ...] = ()  # label names, e.g. ("stream", "group")
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S  # histograms only


CATALOGUE: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in [
        # stream transport (slea.streams)
        MetricSpec("stream_records_produced_total", "counter", "StepRecords XADDed to the step stream.", ("stream",)),
        MetricSpec("stream_bytes_produced_total", "counter", "Payload bytes XADDed to the step stream.", ("stream",)),
        MetricSpec("stream_records_consumed_total", "counter", "Entries delivered to a consumer group.", ("stream", "group")),
        MetricSpec("stream_records_acked_total", "counter", "Entries acknowledged by a consumer group.", ("stream", "group")),
        MetricSpec("stream_records_claimed_total", "counter", "Entries claimed from idle consumers.", ("stream", "group")),
        MetricSpec("stream_dead_lettered_total", "counter", "Entries moved to the dead-letter stream.", ("stream", "group", "reason")),
        MetricSpec("stream_reconnects_total", "counter", "Reconnections after Redis went away.", ("stream", "role")),
        MetricSpec("stream_trimmed_total", "counter", "Entries trimmed after every group acknowledged them.", ("stream",)),
        MetricSpec("stream_lag", "gauge", "Entries in the stream not yet delivered to a group.", ("stream", "group")),
        MetricSpec("stream_pending", "gauge", "Entries delivered to a group but not acknowledged.", ("stream", "group")),
        MetricSpec("stream_length", "gauge", "Entries held in the stream.", ("stream",)),
    ]
}

_lock = threading.Lock()
_live: dict[tuple[str, int], object] = {}


def metric(name: str, registry: CollectorRegistry = REGISTRY):
    """The prometheus-client metric for a catalogue name (created once per registry)."""
    spec = CATALOGUE.get(name)
    if spec is None:
        raise KeyError(f"metric '{name}' is not defined in monitoring/metrics.py")
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


def serve_metrics(port: int, address: str = "0.0.0.0") -> int:
    """Expose the default registry on an HTTP port (outside Ray); returns the bound port."""
    server, _thread = start_http_server(port, addr=address)
    return server.server_port
