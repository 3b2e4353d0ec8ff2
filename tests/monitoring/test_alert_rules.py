"""Every alert is proven to fire: `promtool test rules` runs every *_test.yaml in
monitoring/prometheus/tests/ (input series, expected alerts), and each alert of rules.yaml must be
expected to fire in at least one of them. Every alert links a runbook section that names real
dashboard panels; the PrometheusRule shipped to the operator carries the same rules; the
target-down alert matches the job labels the Prometheus Operator gives PodMonitor targets."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from required_tools import kubectl, promtool

from monitoring.dashboards import completed
from monitoring.prometheus_rule import PROMETHEUS_RULE, render

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring/prometheus/rules.yaml"
PROMTOOL_TESTS = sorted((REPO / "monitoring/prometheus/tests").glob("*_test.yaml"))
RUNBOOK = REPO / "docs/runbook.md"
RUNBOOK_BASE = "https://github.com/slea-rl/slea-rl/blob/main/docs/runbook.md#"


def alerts() -> dict[str, dict]:
    return {
        rule["alert"]: rule
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_promtool_test_files_exist():
    assert len(PROMTOOL_TESTS) >= 5, PROMTOOL_TESTS


@pytest.mark.parametrize("test_file", PROMTOOL_TESTS, ids=lambda path: path.name)
def test_promtool_rule_tests_pass(test_file):
    result = subprocess.run(
        [promtool(), "test", "rules", test_file.name], cwd=test_file.parent, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_expected_to_fire_somewhere():
    fired = {
        case["alertname"]
        for path in PROMTOOL_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    missing = sorted(set(alerts()) - fired)
    assert not missing, f"alerts no promtool test shows firing: {missing} (add a *_test.yaml case)"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _runbook_sections() -> dict[str, str]:
    sections, current = {}, None
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("## "):
            current = _anchor(line[3:])
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def _known_panels() -> dict[str, set[str]]:
    """Dashboard title -> panel titles: ours (monitoring/dashboards.py) and the dashboards Ray ships
    for its own metrics (from the installed Ray, so a renamed panel fails here)."""
    from ray.dashboard.modules.metrics.dashboards.default_dashboard_panels import default_dashboard_config
    from ray.dashboard.modules.metrics.dashboards.serve_dashboard_panels import serve_dashboard_config

    panels = {board.title: {panel.title for panel in board.panels} for board in completed()}
    panels["Default Dashboard"] = {panel.title for row in default_dashboard_config.rows for panel in row.panels}
    panels["Serve Dashboard"] = {panel.title for panel in serve_dashboard_config.panels}
    return panels


def test_every_alert_has_a_runbook_section_naming_real_panels():
    sections = _runbook_sections()
    panels = _known_panels()
    for name, rule in alerts().items():
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(RUNBOOK_BASE), f"{name}: runbook_url {url!r} does not point into docs/runbook.md"
        anchor = url.removeprefix(RUNBOOK_BASE)
        assert anchor in sections, f"{name}: docs/runbook.md has no section #{anchor}"
        text = " ".join(sections[anchor].split())
        for part in ("**Means:**", "**Look at:**", "**Do:**"):
            assert part in text, f"runbook #{anchor} lacks {part}"
        look_at = text.split("**Look at:**", 1)[1].split("**Do:**", 1)[0]
        references = re.findall(r'panel "([^"]+)" on dashboard "([^"]+)"', look_at)
        assert references, f'runbook #{anchor}: \'Look at\' names no panel (write: panel "P" on dashboard "D")'
        for panel, dashboard in references:
            assert panel in panels.get(dashboard, set()), f"runbook #{anchor}: no panel {panel!r} on {dashboard!r}"


def test_prometheus_rule_is_what_the_generator_renders():
    assert PROMETHEUS_RULE.read_text() == render(), "stale: python -m monitoring.prometheus_rule"
    resource = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert resource["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def _monitoring_manifests() -> list[dict]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(REPO / "monitoring")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_operator_setup_ships_the_rules_and_both_podmonitors():
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for doc in _monitoring_manifests()}
    rule = docs[("PrometheusRule", "slea-rules")]
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert {("PodMonitor", "slea-ray"), ("PodMonitor", "slea-redis")} <= set(docs)


def test_target_down_fires_for_every_podmonitor_job_label(tmp_path):
    """The operator labels a PodMonitor's targets job="<namespace>/<name>" (no jobLabel set):
    a generated promtool test with those labels, for every shipped PodMonitor, must fire."""
    monitors = [doc for doc in _monitoring_manifests() if doc["kind"] == "PodMonitor"]
    assert monitors
    jobs = []
    for monitor in monitors:
        assert "jobLabel" not in monitor["spec"], "a jobLabel changes the job label the alert expects"
        jobs.append(f"ml-team/{monitor['metadata']['name']}")
    rule = alerts()["SleaScrapeTargetDown"]
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'up{{job="{job}",instance="10.0.0.{i}:8080"}}', "values": "0x10"}
                    for i, job in enumerate(jobs)
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "SleaScrapeTargetDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": rule["labels"]["severity"],
                                    "job": job,
                                    "instance": f"10.0.0.{i}:8080",
                                },
                                "exp_annotations": {
                                    "runbook_url": rule["annotations"]["runbook_url"],
                                    "summary": f"{job} target 10.0.0.{i}:8080 is down",
                                    "description": rule["annotations"]["description"],
                                },
                            }
                            for i, job in enumerate(jobs)
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "operator_jobs_test.yaml"
    path.write_text(yaml.safe_dump(case))
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
