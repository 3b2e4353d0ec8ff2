"""Every panel of every shipped dashboard shows data of a real run (issue 39): a short `slea train`
(the tiny policy, the library, held-out evaluation) scraped every second by the real Prometheus with
the shipped config, at both endpoints a local run exposes: the driver's prometheus-client port
(monitoring.metrics_port) and the local Ray's metrics export port, through which every actor, the
learner, the library writer and the Serve replicas export. Each panel's PromQL, with the dashboard's
variables filled as Grafana fills them for the run's time range, returns a series with a value over
the run, or the generator marks the panel conditional and says when it has data
(monitoring/dashboards.py). The dashboards are drawn into the run's plots/ (monitoring/panel_render.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from prometheus_fixture import LocalPrometheus, query, wait_for

from monitoring.panel_render import Window, render_dashboards
from slea.ports import free_port

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)
SLEA = [sys.executable, "-m", "driver.cli"]
RUN = "dashboards"
# Ray's processes report their metrics to the agent every RAY_metrics_report_interval_ms (10 s by
# default, ray_config_def.h): a panel's rate() or histogram_quantile() has data once two reports
# with counts between them fall in its window. Reported every 2 s, 40 s of training give each
# several even on a busy machine. The test trained 90 s at the default interval (135 s alone on the
# AMX Xeon against 85 s now); 40 s at the default also showed every panel there, idle, in one run.
REPORT_INTERVAL_MS = 2000
RUN_S = 40  # run.max_seconds: of training


def ray_metrics_export_port(ray_root: Path) -> int | None:
    """The port a local Ray's metrics agent exports on: Ray picks a free one (a local `slea train`
    fixes none) and its dashboard agent writes it into the session directory."""
    for path in (ray_root / "ray" / "session_latest").glob("metrics_export_port_*"):
        text = path.read_text().strip()
        if text:
            return int(text)
    return None


def test_every_dashboard_panel_shows_data_of_a_real_run(tmp_path, tiny_model_dir):
    ray_root = Path(tempfile.mkdtemp(prefix="slea-dash-"))  # this run's Ray alone: short, for its socket paths
    metrics_port = free_port()
    run_dir = tmp_path / RUN
    log_path = tmp_path / "train.log"
    settings = {
        "run.dir": tmp_path,
        "run.id": RUN,
        "model.name": tiny_model_dir,
        "model.max_new_tokens": 8,
        "run.max_seconds": RUN_S,
        "learner.max_steps": 500,
        "learner.checkpoint_every": 5,  # the learner acknowledges its entries at a checkpoint
        "envs.max_steps": 3,
        "envs.panel_size": 4,
        "actors.group_size": 2,
        "learner.tasks_per_step": 1,
        "library.window_seconds": 5,  # several library versions within the run
        "library.snapshot_every": 2,  # and the library acknowledges at a snapshot
        "eval.every": 500,  # no evaluation between learner steps: the CPUs go to training
        "eval.panel_size": 2,
        "eval.samples_per_task": 1,
        "monitoring.metrics_port": metrics_port,
        "monitoring.sinks": "[jsonl]",
    }
    command = [*SLEA, "train", "configs/local.yaml"]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "RAY_TMPDIR": str(ray_root),
                "RAY_metrics_report_interval_ms": str(REPORT_INTERVAL_MS),
            },
        )

    def exporting() -> int | None:
        if process.poll() is not None:
            raise AssertionError(f"slea train exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        return ray_metrics_export_port(ray_root)

    try:
        with LocalPrometheus(tmp_path) as prometheus:
            ray_port = wait_for(exporting, 180, "the local Ray's metrics export port")
            api = prometheus.start([f"127.0.0.1:{metrics_port}", f"127.0.0.1:{ray_port}"], run=RUN)
            start = time.time()
            assert process.wait(timeout=360) == 0, log_path.read_text()[-3000:]
            end = time.time()
            up = query(api, f'max_over_time(up{{run="{RUN}"}}[{int(end - start) + 5}s])')
            assert sorted(float(sample["value"][1]) for sample in up) == [1.0, 1.0], f"both targets scraped: {up}"
            fetched = render_dashboards(api, RUN, Window(start, end), run_dir / "plots")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(ray_root, ignore_errors=True)

    report, unexplained = [f"run {RUN}: unix {start:.0f} to {end:.0f}, drawn into {run_dir / 'plots'}"], []
    for uid, panels in fetched.items():
        assert (run_dir / "plots" / f"dashboard-{uid}.png").is_file()
        report.append(f"{uid}: {sum(panel.has_data for panel in panels)} of {len(panels)} panels with data")
        for panel in panels:
            if not panel.has_data:
                report.append(f"  no data: {panel.title} ({panel.conditional or 'NOT MARKED CONDITIONAL'})")
                if not panel.conditional:
                    unexplained.append(f"{uid}/{panel.title}")
    print("\n".join(report))
    assert not unexplained, (
        f"panels without data in a real run and not marked conditional in monitoring/dashboards.py: {unexplained}\n"
        + "\n".join(report)
    )
