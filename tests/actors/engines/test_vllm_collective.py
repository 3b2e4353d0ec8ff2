"""The collective weight transport into a real vLLM engine: this test is the learner (rank 0 of a
gloo group, the CPU stand-in for NCCL), the engine runs in a subprocess."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import forward_logprobs, perturbed_shipped_model
from required_tools import vllm_python

from slea.weight_group import WeightGroup, host_store, plan_buckets, send_weights


@pytest.mark.slow
def test_vllm_engine_receives_broadcast_weights(tmp_path):
    python = vllm_python()
    checkpoint, model, replacement = perturbed_shipped_model(seed=1)
    weights = replacement.state_dict()  # lm_head.weight is tied: the plan sends it once
    plan = plan_buckets(weights, torch.float32, bucket_bytes=64 * 2**20)
    assert len(plan) > 2 and "lm_head.weight" not in {name for bucket in plan for name, _ in bucket["tensors"]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    store = host_store("127.0.0.1", 2, timeout_s=300)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    probe = subprocess.Popen(
        [
            python,
            str(Path(__file__).with_name("vllm_collective_probe.py")),
            checkpoint,
            str(tmp_path / "plan.json"),
            "127.0.0.1",
            str(store.port),
            str(tmp_path / "out.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        group = WeightGroup(store, 0, 2, "gloo", timeout_s=300)  # waits for the engine's worker to join
        send_weights(group, weights, plan)
        _stdout, stderr = probe.communicate(timeout=300)
    finally:
        probe.kill()
    assert probe.returncode == 0, stderr[-4000:]
    group.close()
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["joined"] == {"dtype": "float32", "ranks": [1]}
    for generation in out["before"]:
        assert generation["policy_version"] == 0
        expected = forward_logprobs(model, generation["prompt_ids"], generation["response_ids"])
        np.testing.assert_allclose(generation["logprobs"], expected, atol=1e-3)
    for generation in out["after"]:
        assert generation["policy_version"] == 3 and len(generation["response_ids"]) > 0
        expected = forward_logprobs(replacement, generation["prompt_ids"], generation["response_ids"])
        np.testing.assert_allclose(generation["logprobs"], expected, atol=1e-3)
