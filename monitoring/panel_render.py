"""Grafana dashboards drawn without Grafana: every panel of monitoring/grafana/*.json queried from a
Prometheus over one time range and drawn with matplotlib, one PNG per dashboard, laid out as Grafana
lays it out (each panel's gridPos). For a run's record (its plots/ directory), a bug report, or a
machine with Prometheus and no Grafana; tests/monitoring/test_dashboard_panels.py draws a real run's.

    python -m monitoring.panel_render --prometheus http://127.0.0.1:9090 --run local --out runs/local/plots

Grafana's variables are filled as Grafana fills them for that range: $run with the run label (a regex,
as the dashboards' multi-value variable is), $__interval from the range over the panel's points, at
least the data source's scrape interval, and $__rate_interval = max($__interval + scrape interval,
4 x scrape interval), so a rate() always spans several scrapes. A panel the generator marked
conditional (its Grafana "noValue" text says when it has data, monitoring/dashboards.py) is drawn
as "no data (conditional: why)" when it has none.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import matplotlib.dates as mdates
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, PercentFormatter, ScalarFormatter

from monitoring.dashboards import GRAFANA_DIR

MAX_POINTS = 1000  # Grafana's maxDataPoints is about the panel's width in pixels
NICE_S = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 21600, 43200, 86400)
LEGEND_MAX = 8  # more series than this: no legend, the count instead (a legend would hide the plot)
UNITS = {  # Grafana unit id -> (y-axis label, tick formatter)
    "short": ("", lambda: ScalarFormatter(useOffset=False)),  # an offset ("+1.077e-2") reads as a value
    "none": ("", lambda: ScalarFormatter(useOffset=False)),
    "percentunit": ("percent", lambda: PercentFormatter(1.0)),
    "s": ("seconds", lambda: EngFormatter(unit="s")),
    "ops": ("per second", lambda: ScalarFormatter(useOffset=False)),
    "Bps": ("bytes per second", lambda: EngFormatter(unit="B/s")),
}


@dataclass
class Series:
    legend: str
    times: list[float]  # unix seconds
    values: list[float]  # NaN where Prometheus answered NaN or +-Inf


@dataclass
class PanelData:
    """One Grafana panel with what its queries returned."""

    title: str
    kind: str  # timeseries | stat
    unit: str  # Grafana unit id
    axis_label: str  # the y axis' label (Grafana's custom.axisLabel), else the unit's
    conditional: str  # why a run may show nothing here ("" = every run should have data)
    grid: dict  # Grafana gridPos: x, y, w, h in 24 columns
    series: list[Series] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return any(math.isfinite(value) for series in self.series for value in series.values)


@dataclass
class Window:
    """The time range of the drawing and the interval variables Grafana would derive from it."""

    start: float  # unix seconds
    end: float
    scrape_interval_s: float = 15.0  # the data source's (Grafana's "timeInterval"; provisioning sets 15s)

    @property
    def interval_s(self) -> float:
        wanted = max((self.end - self.start) / MAX_POINTS, self.scrape_interval_s)
        return next((nice for nice in NICE_S if nice >= wanted), NICE_S[-1])

    @property
    def rate_interval_s(self) -> float:
        return max(self.interval_s + self.scrape_interval_s, 4 * self.scrape_interval_s)


def regex_value(value: str) -> str:
    """A label value as a regex inside a PromQL string (Grafana escapes a multi-value variable so)."""
    return re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\\\1", value)


def fill_variables(expr: str, run: str, window: Window) -> str:
    """A dashboard expression with Grafana's variables replaced for this run and range."""
    values = {
        "run": ".*" if run in ("", "*") else regex_value(run),
        "__rate_interval": f"{window.rate_interval_s:g}s",
        "__interval": f"{window.interval_s:g}s",
        "__interval_ms": f"{window.interval_s * 1000:g}",
        "__range": f"{math.ceil(window.end - window.start)}s",
    }
    return re.sub(r"\$\{?(__rate_interval|__interval_ms|__interval|__range|run)\}?", lambda m: values[m[1]], expr)


def legend_of(legend_format: str, labels: dict[str, str], expr: str) -> str:
    """Grafana's legend: {{label}} filled from the series, else the series' labels, else the query."""
    if legend_format:
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), legend_format).strip() or expr
    shown = {key: value for key, value in labels.items() if key != "__name__"}
    return "{" + ", ".join(f'{key}="{value}"' for key, value in shown.items()) + "}" if shown else expr


def query_range(api: str, expr: str, window: Window) -> list[dict]:
    """Prometheus /api/v1/query_range, one point per $__interval as Grafana asks."""
    params = {"query": expr, "start": window.start, "end": window.end, "step": window.interval_s}
    with urllib.request.urlopen(f"{api}/query_range?{urllib.parse.urlencode(params)}", timeout=30) as response:
        answer = json.loads(response.read())
    if answer.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {answer.get('error', answer)}")
    return answer["data"]["result"]


def fetch_panel(api: str, panel: dict, run: str, window: Window) -> PanelData:
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    data = PanelData(
        title=panel["title"],
        kind=panel.get("type", "timeseries"),
        unit=defaults.get("unit", "short"),
        axis_label=defaults.get("custom", {}).get("axisLabel", ""),
        conditional=defaults.get("noValue", ""),
        grid=panel["gridPos"],
    )
    for target in panel.get("targets", []):
        expr = fill_variables(target["expr"], run, window)
        for result in query_range(api, expr, window):
            times = [float(t) for t, _value in result["values"]]
            values = [
                float(value) if value not in ("NaN", "+Inf", "-Inf") else math.nan for _t, value in result["values"]
            ]
            data.series.append(Series(legend_of(target.get("legendFormat", ""), result["metric"], expr), times, values))
    return data


def fetch_dashboard(api: str, board: dict, run: str, window: Window) -> list[PanelData]:
    return [fetch_panel(api, panel, run, window) for panel in board["panels"] if panel.get("type") != "row"]


def _legend_rows(panel: PanelData, columns: int) -> int:
    shown = len(panel.series) if panel.kind == "timeseries" and len(panel.series) <= LEGEND_MAX else 0
    return math.ceil(shown / columns)


def _draw_timeseries(axes, panel: PanelData, window: Window, legend_columns: int, height_in: float) -> None:
    for series in panel.series:
        times = [datetime.fromtimestamp(t, UTC) for t in series.times]
        axes.plot(times, series.values, label=series.legend, linewidth=1.2, marker="." if len(times) < 30 else None)
    span_s = window.end - window.start
    clock = "%H:%M:%S" if span_s < 3600 else "%H:%M" if span_s < 86400 else "%m-%d %H:%M"
    axes.set_xlim(datetime.fromtimestamp(window.start, UTC), datetime.fromtimestamp(window.end, UTC))  # one range
    axes.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=6))
    axes.xaxis.set_major_formatter(mdates.DateFormatter(clock, tz=UTC))
    label, formatter = UNITS.get(panel.unit, (panel.unit, UNITS["short"][1]))  # another unit: its id as the label
    axes.set_ylabel(panel.axis_label or label, fontsize=8)
    axes.yaxis.set_major_formatter(formatter())
    if panel.unit == "percentunit":  # a share: 0 in view, and 100% once it comes near
        low, high = axes.get_ylim()
        axes.set_ylim(min(low, 0), max(high, 1.02) if high > 0.5 else high)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
    if len(panel.series) > LEGEND_MAX:  # Grafana's legend would list them; here it would bury the plot
        axes.text(0.99, 0.97, f"{len(panel.series)} series", transform=axes.transAxes, ha="right", va="top", fontsize=7)
    elif panel.series:
        axes.legend(
            loc="upper left",
            bbox_to_anchor=(0, -0.3 / height_in),  # under the time axis' tick labels
            ncols=legend_columns,
            fontsize=7,
            frameon=False,
            borderaxespad=0,
            handlelength=1.5,
        )


def _draw_stat(axes, panel: PanelData) -> None:
    """Grafana's stat panel: the last non-null value of each series, side by side."""
    axes.set_axis_off()
    lines = []
    for series in panel.series:
        finite = [value for value in series.values if math.isfinite(value)]
        if finite:
            lines.append((series.legend, finite[-1]))
    for column, (legend, value) in enumerate(lines):
        x = (column + 0.5) / len(lines)
        axes.text(
            x, 0.55, f"{value:g}", ha="center", va="center", fontsize=22, fontweight="bold", transform=axes.transAxes
        )
        axes.text(x, 0.2, legend, ha="center", va="center", fontsize=8, transform=axes.transAxes)


INCH_PER_ROW = 0.42  # one Grafana grid row (30 px in Grafana)
MARGIN_IN = {"left": 0.85, "right": 0.2, "top": 0.4, "bottom": 0.45, "legend_row": 0.17}


def draw_dashboard(title: str, panels: list[PanelData], window: Window, path: Path, subtitle: str = "") -> Path:
    """One PNG: every panel at its Grafana grid position (24 columns), titled, its y axis labelled
    with the unit, a legend under the time axis when it has few series."""
    width_in, header_in = 20.0, 0.8
    rows = max((p.grid["y"] + p.grid["h"] for p in panels), default=1)
    height_in = header_in + rows * INCH_PER_ROW
    figure = Figure(figsize=(width_in, height_in))
    figure.suptitle(f"{title}\n{subtitle}" if subtitle else title, fontsize=12, y=1 - 0.1 / height_in, va="top")
    for panel in panels:
        x, y, w, h = (panel.grid[key] for key in ("x", "y", "w", "h"))
        cell_left, cell_width = x / 24 * width_in, w / 24 * width_in
        cell_top = header_in + y * INCH_PER_ROW  # from the figure's top
        columns = max(1, int(cell_width / 2.2))  # legend entries per row
        bottom = MARGIN_IN["bottom"] + _legend_rows(panel, columns) * MARGIN_IN["legend_row"]
        axes_height = max(h * INCH_PER_ROW - MARGIN_IN["top"] - bottom, 0.3)
        axes = figure.add_axes(
            (
                (cell_left + MARGIN_IN["left"]) / width_in,
                1 - (cell_top + MARGIN_IN["top"] + axes_height) / height_in,
                (cell_width - MARGIN_IN["left"] - MARGIN_IN["right"]) / width_in,
                axes_height / height_in,
            )
        )
        axes.set_title(panel.title, fontsize=10, loc="left", pad=9)  # clear of a "1e-17" multiplier
        if not panel.has_data:
            axes.set_axis_off()
            why = f"no data (conditional: {panel.conditional})" if panel.conditional else "no data"
            axes.text(0.5, 0.5, why, ha="center", va="center", fontsize=9, color="0.4", transform=axes.transAxes)
        elif panel.kind == "stat":
            _draw_stat(axes, panel)
        else:
            _draw_timeseries(axes, panel, window, columns, axes_height)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}")  # a reader never sees half a PNG
    figure.savefig(staging, dpi=100, format="png")
    staging.replace(path)
    return path


def render_dashboards(
    api: str, run: str, window: Window, out_dir: Path, dashboard_files: list[Path] | None = None
) -> dict[str, list[PanelData]]:
    """Fetch and draw every dashboard (the shipped ones unless told); returns uid -> its panels' data."""
    fetched = {}
    when = f"{datetime.fromtimestamp(window.start, UTC):%Y-%m-%d %H:%M:%S} - {datetime.fromtimestamp(window.end, UTC):%H:%M:%S} UTC"
    for path in dashboard_files or sorted(GRAFANA_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        panels = fetch_dashboard(api, board, run, window)
        subtitle = f"run {run or 'all'}, {when} (times in UTC), $__rate_interval {window.rate_interval_s:g} s"
        path = out_dir / f"dashboard-{board['uid']}.png"
        draw_dashboard(board["title"], panels, window, path, subtitle)
        fetched[board["uid"]] = panels
    return fetched


def _time(text: str) -> float:
    """Unix seconds from a number or an ISO 8601 time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        moment = datetime.fromisoformat(text)
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m monitoring.panel_render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--run", default="", help="the run label to show (the dashboards' $run; empty: all runs)")
    parser.add_argument("--out", type=Path, required=True, help="directory for dashboard-<uid>.png (a run's plots/)")
    parser.add_argument("--start", type=_time, help="unix seconds or ISO time (default: 3 h before --end)")
    parser.add_argument("--end", type=_time, help="unix seconds or ISO time (default: now)")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="the data source's, in seconds")
    parser.add_argument("dashboards", nargs="*", type=Path, help="dashboard JSON files (default: the shipped ones)")
    args = parser.parse_args(argv)
    end = args.end or time.time()
    window = Window(args.start or end - 3 * 3600, end, args.scrape_interval)
    api = args.prometheus.rstrip("/") + "/api/v1"
    for uid, panels in render_dashboards(api, args.run, window, args.out, args.dashboards or None).items():
        empty = [p.title for p in panels if not p.has_data]
        print(f"{args.out / f'dashboard-{uid}.png'}: {len(panels) - len(empty)} of {len(panels)} panels with data")
        for title in empty:
            print(f"  no data: {title}")


if __name__ == "__main__":
    main()
