"""Dashboards and alert rules name only metrics monitoring/ defines, every defined metric is on
a dashboard, the PromQL parses (promtool), and the provisioning/Kustomize files load them all."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from promql_names import metric_names, series_names
from required_tools import kubectl, promtool

from monitoring.catalogue import CATALOGUE, MetricSpec
from monitoring.dashboards import GRAFANA_DIR, completed, render, rendered_files

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring/prometheus/rules.yaml"


def dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(GRAFANA_DIR.glob("*.json"))}


def dashboard_exprs() -> list[tuple[str, str]]:
    """(dashboard/panel, PromQL) for every target of every panel."""
    return [
        (f"{name}/{panel['title']}", target["expr"])
        for name, board in dashboards().items()
        for panel in board["panels"]
        for target in panel["targets"]
    ]


def rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    return [(rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def test_dashboard_json_is_what_the_generator_renders():
    expected = rendered_files()
    assert set(expected) == set(GRAFANA_DIR.glob("*.json")), "regenerate: python -m monitoring.dashboards"
    for path, text in expected.items():
        assert path.read_text() == text, f"{path.name} is stale: python -m monitoring.dashboards"


@pytest.mark.parametrize("source", ["dashboards", "rules"])
def test_promql_names_only_catalogue_metrics(source):
    known = series_names()
    exprs = dashboard_exprs() if source == "dashboards" else rule_exprs()
    assert exprs
    for where, expr in exprs:
        unknown = metric_names(expr) - set(known)
        assert not unknown, f"{where}: {sorted(unknown)} not defined in monitoring/catalogue.py (or wrong suffix)"


def test_every_catalogue_metric_is_on_a_dashboard():
    known = series_names()
    shown = {known[name] for _where, expr in dashboard_exprs() for name in metric_names(expr) if name in known}
    missing = sorted(set(CATALOGUE) - shown)
    assert not missing, f"metrics on no dashboard: {missing} (add panels in monitoring/dashboards.py)"


def test_a_new_metric_gets_a_default_panel_on_its_prefix_dashboard(monkeypatch):
    specs = [
        MetricSpec("learner_test_loss", "gauge", "test", ("phase",)),
        MetricSpec("learner_test_seconds", "histogram", "test"),
        MetricSpec("other_test_total", "counter", "test"),
    ]
    for spec in specs:
        monkeypatch.setitem(CATALOGUE, spec.name, spec)
    boards = {d.uid: render(d) for d in completed()}
    known = series_names()
    for uid, name in [
        ("slea-learner", "learner_test_loss"),
        ("slea-learner", "learner_test_seconds"),
        ("slea-overview", "other_test_total"),
    ]:
        exprs = [t["expr"] for panel in boards[uid]["panels"] for t in panel["targets"]]
        assert any(known.get(found) == name for expr in exprs for found in metric_names(expr)), (uid, name)


def test_name_parsing_handles_suffixes_and_strings():
    assert metric_names('sum(rate(slea_a_bucket{x="slea_not_a_metric"}[5m])) / slea_b') == {"slea_a_bucket", "slea_b"}
    histogram = next(spec for spec in CATALOGUE.values() if spec.kind == "histogram")
    counter = next(spec for spec in CATALOGUE.values() if spec.kind == "counter")
    names = series_names()
    assert f"slea_{histogram.name}_bucket" in names and f"slea_{histogram.name}" not in names
    assert f"slea_{counter.name}" in names and f"slea_{counter.name.removesuffix('_total')}" not in names


def test_dashboards_have_datasource_and_run_variables_and_filter_by_run():
    for name, board in dashboards().items():
        variables = {var["name"]: var for var in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["run"]["type"] == "query", name
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}"
            for target in panel["targets"]:
                assert target["expr"].count("slea_") == target["expr"].count('run=~"$run"'), f"{name}: {target['expr']}"


def test_dashboards_cover_the_issue_views():
    titles = {board["title"] for board in dashboards().values()}
    for view in ("Run overview", "Actors", "Learner", "Experience library", "Step stream"):
        assert any(title.endswith(view) for title in titles), f"no {view} dashboard"


def test_promtool_accepts_the_alert_rules():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {name for name, _expr in rule_exprs()}
    assert {
        "SleaStreamLagGrowing",
        "SleaDeadLetters",
        "SleaStalenessOverBound",
        "SleaSuccessRateStuckAtZero",
        "SleaLibraryExtractionFailing",
        "SleaScrapeTargetDown",
    } <= alerts


def test_dashboard_promql_parses(tmp_path):
    """promtool parses every dashboard query (Grafana's variables replaced by concrete values)."""
    rules = [
        {
            "record": f"slea_dashboard:check_{index}",
            "expr": expr.replace("$__rate_interval", "5m").replace("$run", ".*"),
        }
        for index, (_where, expr) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard_exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_scrape_configs_agree(tmp_path):
    """prometheus.yml passes `promtool check config`; its jobs and the PodMonitor relabel alike.

    Debian's Prometheus is built without Kubernetes discovery, so the Kubernetes job is checked
    with its discovery swapped for a static target: relabelling, regexes and the rest still are."""
    config_path = REPO / "monitoring/prometheus/prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    checked = yaml.safe_load(config_path.read_text())
    for job in checked["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["127.0.0.1:8080"]}]
    checked["rule_files"] = [str(config_path.parent / name) for name in checked["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(checked))
    result = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    relabels = [job["metric_relabel_configs"] for job in config["scrape_configs"]]
    assert all(r == relabels[0] for r in relabels)
    podmonitor = yaml.safe_load((REPO / "monitoring/prometheus/podmonitor.yaml").read_text())
    camel = {"source_labels": "sourceLabels", "target_label": "targetLabel"}
    expected = [{camel.get(key, key): value for key, value in rule.items()} for rule in relabels[0]]
    assert podmonitor["spec"]["podMetricsEndpoints"][0]["metricRelabelings"] == expected


def test_monitoring_kustomization_ships_every_dashboard_and_the_rules():
    result = subprocess.run(
        [kubectl(), "kustomize", str(REPO / "monitoring")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    docs = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(result.stdout)}
    assert docs["slea-ray"]["kind"] == "PodMonitor"
    dashboard_map = docs["slea-grafana-dashboards"]
    assert dashboard_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(dashboard_map["data"]) == {path.name for path in GRAFANA_DIR.glob("*.json")}
    assert docs["slea-prometheus-rules"]["data"]["rules.yaml"] == RULES.read_text()


def test_grafana_provisioning_points_at_the_dashboards():
    provider = yaml.safe_load((GRAFANA_DIR / "provisioning/dashboards/slea.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards/slea"
    datasource = yaml.safe_load((GRAFANA_DIR / "provisioning/datasources/prometheus.yaml").read_text())["datasources"][
        0
    ]
    assert datasource["type"] == "prometheus"
