"""The alert rules as a Prometheus Operator PrometheusRule, generated from the plain rule file.

`monitoring/prometheus/rules.yaml` stays the one source (plain Prometheus loads it through
`rule_files`, promtool tests it); kube-prometheus-stack wants the same groups inside a
PrometheusRule resource, which Kustomize cannot build from a file's content. So this module writes
`monitoring/prometheus/prometheusrule.yaml` and tests/monitoring checks that the file on disk is
what it renders. After editing rules.yaml: `python -m monitoring.prometheus_rule`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

PROMETHEUS_DIR = Path(__file__).resolve().parent / "prometheus"
RULES = PROMETHEUS_DIR / "rules.yaml"
PROMETHEUS_RULE = PROMETHEUS_DIR / "prometheusrule.yaml"
HEADER = (
    "# GENERATED from rules.yaml by `python -m monitoring.prometheus_rule`: edit rules.yaml and regenerate.\n"
    "# The label `release: kube-prometheus-stack` matches the Helm chart's default ruleSelector.\n"
)


class _Literal(yaml.SafeDumper):
    """Multi-line strings (PromQL, descriptions) as literal blocks, as they read in rules.yaml."""


_Literal.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def render() -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "slea-rules", "labels": {"release": "kube-prometheus-stack"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(resource, Dumper=_Literal, sort_keys=False, width=1000)


def main() -> None:
    PROMETHEUS_RULE.write_text(render())
    print(f"wrote {PROMETHEUS_RULE}")


if __name__ == "__main__":
    main()
