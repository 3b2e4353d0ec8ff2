"""monitoring/panel_render.py without a Prometheus: Grafana's variables filled as Grafana fills them,
legends, and a drawing of every kind of panel (data, stat, none, conditional, many series)."""

from __future__ import annotations

import math

from monitoring.panel_render import PanelData, Series, Window, draw_dashboard, fill_variables, legend_of


def test_intervals_as_grafana_derives_them():
    three_minutes = Window(0, 180, scrape_interval_s=1)
    assert three_minutes.interval_s == 1 and three_minutes.rate_interval_s == 4  # 4 scrapes
    provisioned = Window(0, 180)  # the provisioned data source's 15 s
    assert provisioned.interval_s == 15 and provisioned.rate_interval_s == 60
    day = Window(0, 86400, scrape_interval_s=15)  # 86.4 s per point -> the next nice interval
    assert day.interval_s == 120 and day.rate_interval_s == 135


def test_variables_filled_for_one_run():
    expr = 'sum(rate(slea_x{run=~"$run"}[$__rate_interval])) / ${__interval_ms} + $__interval + $__range'
    filled = fill_variables(expr, "tw.s0", Window(0, 180, scrape_interval_s=1))
    assert filled == r'sum(rate(slea_x{run=~"tw\\.s0"}[4s])) / 1000 + 1s + 180s'
    assert 'run=~".*"' in fill_variables(expr, "", Window(0, 180))  # every run, as the variable's All


def test_legends_as_grafana_formats_them():
    labels = {"__name__": "slea_x", "group": "learner", "stream": "s"}
    assert legend_of("{{group}} lag", labels, "q") == "learner lag"
    assert legend_of("", labels, "q") == '{group="learner", stream="s"}'
    assert legend_of("{{missing}}", labels, "q") == "q"  # an empty legend would hide the line's name


def test_every_kind_of_panel_draws(tmp_path):
    times = [float(t) for t in range(0, 180, 15)]
    panels = [
        PanelData(
            "Rate", "timeseries", "ops", "", "", {"x": 0, "y": 0, "w": 12, "h": 8}, [Series("a", times, [1.0] * 12)]
        ),
        PanelData(
            "Share",
            "timeseries",
            "percentunit",
            "",
            "",
            {"x": 12, "y": 0, "w": 12, "h": 8},
            [Series("b", times, [0.5] * 12)],
        ),
        PanelData(
            "Version", "stat", "short", "", "", {"x": 0, "y": 8, "w": 12, "h": 5}, [Series("v", times, [3.0] * 12)]
        ),
        PanelData("EDGE", "timeseries", "short", "", "EDGE runs only", {"x": 12, "y": 8, "w": 12, "h": 8}),
        PanelData(
            "Many",
            "timeseries",
            "s",
            "",
            "",
            {"x": 0, "y": 16, "w": 24, "h": 8},
            [Series(str(n), times, [n * 0.01] * 12) for n in range(12)],
        ),
        PanelData(
            "NaN only",
            "timeseries",
            "short",
            "",
            "",
            {"x": 0, "y": 24, "w": 12, "h": 8},
            [Series("n", times, [math.nan] * 12)],
        ),
    ]
    assert [panel.has_data for panel in panels] == [True, True, True, False, True, False]
    path = draw_dashboard("SLEA-RL / Test", panels, Window(0, 180), tmp_path / "plots" / "dashboard-test.png", "run t")
    assert path.is_file() and path.stat().st_size > 10_000
