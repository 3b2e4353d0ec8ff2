"""SleaRetrievalErrors fires on a persistent share of retrieval errors and only then: its
`promtool test rules` file (monitoring/prometheus/tests/retrieval_errors_test.yaml) passes."""

from __future__ import annotations

import subprocess

from test_dashboards import REPO, promtool

ALERT_TEST = REPO / "monitoring/prometheus/tests/retrieval_errors_test.yaml"


def test_retrieval_errors_alert_fires_after_10_minutes_over_5_percent_and_resolves():
    result = subprocess.run([promtool(), "test", "rules", str(ALERT_TEST)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
