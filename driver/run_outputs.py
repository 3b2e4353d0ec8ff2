"""What a training run leaves to read: metrics.jsonl, the configured sinks' files, PNG plots.

`slea train` hands the RunRecorder one flat dict of metrics per learner step. Each becomes a
JSON line (the durable record: plots and learning curves are rebuilt from it alone, and a
resumed run appends to it), goes to the sinks of `monitoring.sinks` (TensorBoard, W&B: for live
inspection, driver/sinks.py), and every `plot_every` steps the PNGs are redrawn from the
whole file, so a run killed at any point leaves plots.

Metric keys the plots read (any other key is recorded and sent to the sinks, not plotted):

    actors/success_rate              success of episodes finished since the last learner step
    actors/success_rate/<task_type>  the same per task type
    actors/episode_length            mean steps of those episodes (per type: .../<task_type>)
    library/size/<zone>              experiences in the zone: strategy, warning
    stream/lag/<group>               entries the consumer group has not read: learner, library
    eval/success_rate                held-out panel success (steps where an evaluation ran)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from driver.sinks import MetricSink

METRICS_FILE = "metrics.jsonl"
PLOTS_DIR = "plots"

# (file name, metric key prefix, title, y label, y limited to [0, 1])
PLOTS = (
    ("success_rate.png", "actors/success_rate", "success rate by task type", "success rate", True),
    ("episode_length.png", "actors/episode_length", "episode length", "steps per episode", False),
    ("library_size.png", "library/size", "library size per zone", "experiences", False),
    ("stream_lag.png", "stream/lag", "stream lag per consumer group", "entries behind", False),
    ("eval_success.png", "eval/success_rate", "held-out panel success", "success rate", True),
)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """metrics.jsonl as dicts in step order. Lines of the same step merge, a later value winning:
    a held-out evaluation adds its line to the learner's line of that step, and a resumed run
    redoes the steps after its last checkpoint. A torn last line (a crash mid-write) is skipped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        by_step.setdefault(int(entry["step"]), {}).update(entry)
    return [by_step[step] for step in sorted(by_step)]


def series(entries: list[dict], prefix: str) -> dict[str, tuple[list[int], list[float]]]:
    """Every numeric key equal to `prefix` or under `prefix/`: key -> (steps, values), gaps skipped."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for entry in entries:
        for key, value in entry.items():
            if (key == prefix or key.startswith(prefix + "/")) and _is_number(value):
                steps, values = found.setdefault(key, ([], []))
                steps.append(entry["step"])
                values.append(float(value))
    return dict(sorted(found.items()))


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, 2)
        return handle.read(1)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def draw_lines(
    lines: dict[str, tuple[list[int], list[float]]],
    path: Path,
    title: str,
    ylabel: str,
    unit_interval: bool,
    xlabel: str = "learner step",
    bands: dict[str, tuple[list[float], list[float]]] | None = None,
) -> None:
    """One line per label; `bands` (label -> lows, highs at the line's steps) shades a spread around it."""
    figure = Figure(figsize=(7, 4))
    axes = figure.subplots()
    for label, (steps, values) in lines.items():
        drawn = axes.plot(steps, values, marker="." if len(steps) < 50 else None, label=label)[0]
        if bands and label in bands:
            axes.fill_between(steps, *bands[label], color=drawn.get_color(), alpha=0.15, linewidth=0)
    if unit_interval:
        axes.set_ylim(-0.02, 1.02)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}")  # readers (a browser refreshing) never see half a PNG
    figure.savefig(staging, dpi=100, format="png")
    staging.replace(path)


def render_plots(run_dir: str | Path) -> list[Path]:
    """Redraw every plot whose metrics are present in the run's metrics.jsonl; returns the files written."""
    entries = read_metrics(run_dir)
    written = []
    for file_name, prefix, title, ylabel, unit_interval in PLOTS:
        lines = series(entries, prefix)
        if lines:
            path = Path(run_dir) / PLOTS_DIR / file_name
            draw_lines(lines, path, title, ylabel, unit_interval)
            written.append(path)
    return written


class RunRecorder:
    """Per-learner-step outputs of one run directory (append-only, so --resume just continues)."""

    def __init__(
        self, run_dir: str | Path, *, sinks: Sequence[MetricSink] = (), plots: bool = True, plot_every: int = 5
    ):
        self.run_dir = Path(run_dir)
        self.sinks = list(sinks)
        self.plots = plots
        self.plot_every = plot_every
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / METRICS_FILE
        torn = path.is_file() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        self._file = open(path, "a")
        if torn:  # a crash mid-line: end it, so the resumed run's first line is not glued onto it
            self._file.write("\n")

    def record(self, step: int, metrics: dict[str, float | int | str]) -> None:
        """One learner step's metrics (flat: 'actors/success_rate/pick' -> 0.25)."""
        now = time.time()
        self._file.write(json.dumps({"step": step, "time": now, **metrics}) + "\n")
        self._file.flush()  # a killed run keeps every step it finished
        numeric = {key: value for key, value in metrics.items() if _is_number(value)}
        for sink in self.sinks:
            sink.record(step, numeric, now)
        if self.plots and step % self.plot_every == 0:
            render_plots(self.run_dir)

    def close(self) -> None:
        """Flush everything and draw the final plots."""
        self._file.close()
        for sink in self.sinks:
            sink.close()
        if self.plots:
            render_plots(self.run_dir)

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def compare_runs(run_dirs: list[str | Path], out_png: str | Path, key: str = "eval/success_rate") -> tuple[str, Path]:
    """`slea compare`: a markdown table of `key` per learner step and the plot of the same curves,
    one column per run, labelled "<run id> (<preset>)" from its config.yaml. Arms with seeds and
    intervals: `slea compare --by-preset` (driver/study.py)."""
    columns, lines = {}, {}
    for run_dir in run_dirs:
        run = run_section(run_dir)
        found = series(read_metrics(run_dir), key).get(key)
        if found is None:
            raise ValueError(
                f"run '{run.get('id', Path(run_dir).name)}' ({run_dir}) has no '{key}' in {METRICS_FILE}: "
                "it recorded no held-out evaluation yet"
            )
        label = f"{run.get('id', Path(run_dir).name)} ({run.get('preset', '?')})"
        lines[label] = found
        columns[label] = {step: f"{value:.3f}" for step, value in zip(*found)}
    steps = sorted({step for column in columns.values() for step in column})
    png = Path(out_png)
    draw_lines(
        lines,
        png,
        f"held-out panel: {key}",
        key.rsplit("/", 1)[-1].replace("_", " "),
        unit_interval=key.endswith("_rate"),
    )
    rows = [f"| learner step | {' | '.join(columns)} |", "|---" * (len(columns) + 1) + "|"]
    for step in steps:
        rows.append(f"| {step} | {' | '.join(column.get(step, '-') for column in columns.values())} |")
    return "\n".join(rows), png


def run_section(run_dir: str | Path) -> dict:
    """The `run:` section of the run directory's config.yaml ({} without one)."""
    import yaml

    config_file = Path(run_dir) / "config.yaml"
    return yaml.safe_load(config_file.read_text()).get("run", {}) if config_file.is_file() else {}
