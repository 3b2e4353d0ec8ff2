"""driver/device_check.py, the air-gapped node's probes, on a CPU with a tiny model of the same
family, so that a GPU run is never the first time their code runs: the log-prob gap by hand, the
stand-in for Ray, the synthetic tokenizer, the engine's log-probs against the learner's and the
weight hand-off in one process, and the learner step as the node runs it (a process without Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from driver.device_check import TINY_RUNS, engine_and_handoff, logprob_gap, synthetic_tokenizer

REPO = Path(__file__).resolve().parents[2]


def test_the_logprob_gap_by_hand():
    engine = [np.array([-1.0, -2.0]), np.array([-0.5])]
    learner = [np.array([-1.1, -1.8]), np.array([-0.5])]
    gap = logprob_gap(engine, learner)
    # learner - engine: -0.1, +0.2, 0
    assert gap == pytest.approx({"mean_abs": 0.1, "max_abs": 0.2, "mean": 0.1 / 3, "tokens": 3})


def test_the_synthetic_tokenizer_has_the_special_ids_and_decodes_every_id():
    tokenizer = synthetic_tokenizer(300)
    assert len(tokenizer) == 300 and (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    assert tokenizer.decode([5, 299]) == "<5> <299>"
    assert tokenizer("<7> <8>")["input_ids"] == [7, 8]


@pytest.mark.slow  # DeepSpeed and a model
def test_the_engine_agrees_with_the_learner_and_generates_with_its_weights_after_the_handoff():
    figures = engine_and_handoff(**TINY_RUNS["engine_and_handoff"])
    assert all(figures["checks"].values()), figures["checks"]
    assert figures["engine"] == "transformers, float32" and figures["learner_compute_dtype"] == "float32"
    assert figures["gap_before_update"]["mean_abs"] < 1e-5 and figures["gap_after_handoff"]["mean_abs"] < 1e-5
    assert figures["gap_without_handoff"]["mean_abs"] > 0.05, "the step moved the policy: a lost hand-off would show"
    assert figures["gap_before_update"]["tokens"] == figures["generated_tokens"] > 0
    assert figures["learner_behav_abs_log_diff"] < 1e-5  # the learner's own measure of the same gap
    assert figures["versions_after_handoff"] == [1]


@pytest.mark.slow  # DeepSpeed and a model, in a process of its own
def test_the_learner_step_runs_as_on_the_node_without_ray(tmp_path):
    figures_path = tmp_path / "figures.json"
    hide_ray = (
        "import sys; sys.modules['ray'] = None; from driver.device_check import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", hide_ray, "learner_step", "--tiny"], cwd=REPO, capture_output=True, text=True,
        timeout=300, env={**os.environ, "SLEA_CHECK_FIGURES": str(figures_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(figures_path.read_text())
    assert figures["checks"] == {"finite": True}
    assert figures["tokens_per_step"] == 4 * (48 + 16) and figures["tokens_per_s"] > 0
    assert figures["matmul_tflops"] > 0 and 0 < figures["mfu"] < 1
    assert figures["achieved_tflops"] == pytest.approx(figures["model_tflop_per_step"] / figures["step_seconds"])
    assert figures["counted_gib"] > 0 and figures["peak_memory_gib"] > 0
    assert set(figures["counted_terms_gib"]) == {
        "weights", "masters", "grads", "moments", "reference", "activations", "logits",
    }  # fmt: skip
    assert (figures["zero_stage"], figures["activation_checkpointing"]) == (0, True)  # configs/gpu.yaml's learner
