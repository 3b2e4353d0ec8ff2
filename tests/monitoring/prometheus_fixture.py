"""A real Prometheus (Debian's binary) on loopback with the shipped scrape config and alert rules,
pointed at live targets: the Prometheus tests (test_prometheus_scrape.py, test_dashboard_panels.py)
share it."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from required_tools import prometheus as prometheus_binary

from slea.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "monitoring/prometheus/prometheus.yml"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = condition()
        except OSError:
            result = None
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def query(api: str, promql: str) -> list[dict]:
    answer = get_json(f"{api}/query?{urllib.parse.urlencode({'query': promql})}")
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


class LocalPrometheus:
    """Prometheus processes started by `start`, stopped on leaving the `with` block."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen] = []

    def start(self, targets: list[str], job_name: str = "slea-local", run: str | None = None) -> str:
        """Prometheus scraping `targets` every second as the shipped job `job_name` (its run label
        set to `run` when given); returns its API URL once it is ready."""
        config = yaml.safe_load(SHIPPED.read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(SHIPPED.parent / name) for name in config["rule_files"]]
        # no Kubernetes here: keep one job and point it at the live components (a Kubernetes job
        # loses its pod discovery and the relabelling that reads pod metadata)
        (job,) = [job for job in config["scrape_configs"] if job["job_name"] == job_name]
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["relabel_configs"] = [
                rule
                for rule in job.get("relabel_configs", [])
                if not any(label.startswith("__meta_kubernetes") for label in rule["source_labels"])
            ]
        static = {**(job.get("static_configs") or [{}])[0], "targets": targets}
        if run is not None:
            static["labels"] = {**static.get("labels", {}), "run": run}
        job["static_configs"] = [static]
        config["scrape_configs"] = [job]
        config_path = self.tmp_path / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        port = free_port()
        log = (self.tmp_path / "prometheus.log").open("w")
        self.processes.append(
            subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        wait_for(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2).status == 200,
            30,
            "prometheus to be ready",
        )
        return f"http://127.0.0.1:{port}/api/v1"

    def __enter__(self) -> LocalPrometheus:
        return self

    def __exit__(self, *exc_info) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(timeout=30)
