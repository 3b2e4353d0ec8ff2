"""The driver sizing its own actor pool (`actors.autoscale`) in a real `slea train` on a local Ray."""

import subprocess
import sys

import pytest
from helpers import tiny_run

from driver.run_outputs import read_metrics

pytestmark = pytest.mark.slow
SLEA = [sys.executable, "-m", "driver.cli"]


def test_a_learner_waiting_for_groups_grows_the_pool(tmp_path, tiny_model_dir):
    # One worker plays one group of 2 at a time and the learner wants 2 groups per step: it waits
    # most of its time (a tiny model trains in milliseconds), so the first decision grows the pool.
    settings = [
        *tiny_run(tmp_path, "autoscale", tiny_model_dir),
        "actors.num_workers=1",
        "actors.autoscale.min_workers=1",
        "actors.autoscale.max_workers=2",
        "actors.autoscale.interval_s=4",
        "learner.tasks_per_step=2",
        "learner.max_steps=8",
        "eval.every=0",
        "monitoring.sinks=[jsonl]",
        "monitoring.plots=false",
    ]
    result = subprocess.run(
        [*SLEA, "train", "configs/local.yaml", *[arg for setting in settings for arg in ("--set", setting)]],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "actor pool: 1 -> 2 workers (autoscale: learner waited" in result.stderr, result.stderr[-3000:]
    assert "-> 1 workers" not in result.stderr  # nothing held the workers back: no reason to shrink
    steps = [line for line in read_metrics(tmp_path / "autoscale") if "learner/policy_version" in line]
    assert [line["learner/policy_version"] for line in steps] == list(range(1, 9))
    assert not (tmp_path / "autoscale" / "driver.json").exists()
