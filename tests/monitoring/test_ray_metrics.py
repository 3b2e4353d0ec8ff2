"""The Ray backend keeps prometheus-client's surface (labels, inc, set, observe) over a fake of
ray.util.metrics; outside Ray, `metric()` stays prometheus-client."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from monitoring import ray_metrics
from monitoring.catalogue import CATALOGUE, MetricSpec
from monitoring.metrics import metric


class FakeRayMetric:
    """Records what ray.util.metrics would be asked to record."""

    def __init__(self):
        self.calls: list[tuple[str, float, dict]] = []

    def inc(self, value, tags):
        self.calls.append(("inc", value, tags))

    def set(self, value, tags):
        self.calls.append(("set", value, tags))

    def observe(self, value, tags):
        self.calls.append(("observe", value, tags))


def wrapped(kind: str, labels: tuple[str, ...] = ("stream", "group")):
    backend = FakeRayMetric()
    spec = MetricSpec(f"test_{kind}", kind, "test metric", labels)
    return ray_metrics._KINDS[kind](spec, backend, tags=None, values={}), backend


def test_counter_labels_by_name_or_position():
    counter, backend = wrapped("counter")
    counter.labels(stream="s", group="learner").inc(2)
    counter.labels("s", "library").inc()
    assert backend.calls == [
        ("inc", 2.0, {"stream": "s", "group": "learner"}),
        ("inc", 1.0, {"stream": "s", "group": "library"}),
    ]


def test_counter_skips_zero_and_refuses_negative():
    counter, backend = wrapped("counter")
    child = counter.labels(stream="s", group="g")
    child.inc(0)  # prometheus-client allows it; Ray would raise
    assert backend.calls == []
    with pytest.raises(ValueError, match="only increase"):
        child.inc(-1)


def test_gauge_set_inc_dec_per_series():
    gauge, backend = wrapped("gauge")
    first, second = gauge.labels(stream="s", group="a"), gauge.labels(stream="s", group="b")
    first.set(5)
    first.inc(2)
    second.dec()
    assert [call[:2] for call in backend.calls] == [("set", 5.0), ("set", 7.0), ("set", -1.0)]


def test_every_gauge_series_is_set_again_so_ray_keeps_exporting_it(monkeypatch):
    """Ray exports a gauge only in the interval it was set in and drops it 2 intervals later: a
    learner gauge set once a step vanished between steps. The refresh sets each series again."""
    monkeypatch.setattr(ray_metrics, "_refresher", object())  # no thread here: the test refreshes by hand
    gauge, backend = wrapped("gauge")
    counter, counter_backend = wrapped("counter")
    monkeypatch.setitem(ray_metrics._live, "test_gauge", gauge)
    monkeypatch.setitem(ray_metrics._live, "test_counter", counter)
    gauge.labels(stream="s", group="a").set(5)
    gauge.labels(stream="s", group="b").inc(2)
    counter.labels(stream="s", group="a").inc()
    backend.calls.clear()
    ray_metrics.refresh_gauges()
    assert {(kind, value, tuple(tags.items())) for kind, value, tags in backend.calls} == {
        ("set", 5.0, (("group", "a"), ("stream", "s"))),
        ("set", 2.0, (("group", "b"), ("stream", "s"))),
    }
    assert len(counter_backend.calls) == 1  # a counter's total stays in Ray: nothing is sent again


def test_histogram_and_unlabelled_metrics():
    histogram, backend = wrapped("histogram", labels=())
    histogram.observe(0.25)
    assert backend.calls == [("observe", 0.25, {})]
    with pytest.raises(ValueError, match="has no labels"):
        histogram.labels("x")


def test_wrong_or_missing_labels_say_which():
    counter, _ = wrapped("counter")
    with pytest.raises(ValueError, match=r"takes labels \('stream', 'group'\)"):
        counter.labels(stream="s")
    with pytest.raises(ValueError, match="call .labels"):
        counter.inc()
    with pytest.raises(ValueError, match="already applied"):
        counter.labels(stream="s", group="g").labels(stream="s", group="g")


def test_every_catalogue_histogram_has_ray_compatible_buckets():
    """Ray rejects non-positive histogram boundaries."""
    for spec in CATALOGUE.values():
        if spec.kind == "histogram":
            assert all(bound > 0 for bound in spec.buckets), spec.name


def test_outside_ray_metric_is_prometheus_client():
    assert not ray_metrics.ray_backend_active()
    assert isinstance(metric("stream_records_produced_total", CollectorRegistry()), Counter)
