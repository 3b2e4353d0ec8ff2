"""`slea eval`: which weights a path means, and the real entry point on a run directory."""

import json
import subprocess
import sys

import pytest
from required_tools import vllm_python

from driver.evaluate import resolve_policy
from slea.config import dump_config, load_config
from slea.models import SHIPPED, load_model, tiny_model

SLEA = [sys.executable, "-m", "driver.cli"]


def fake_run(tmp_path, versions=(2, 3), save_weights=False, shipped=False):
    """A run directory in the learner's checkpoint layout (learner/checkpoint.py), with its config;
    its newest checkpoint holds the tiny model, or with `shipped` SmolLM2 (vLLM's CPU attention
    refuses the tiny model's head size of 16)."""
    run = tmp_path / "run"
    root = run / "learner" / "checkpoints"
    for version in versions:
        checkpoint = root / f"v{version:08d}"
        (checkpoint / "hf").mkdir(parents=True)
        (checkpoint / "state.json").write_text(
            json.dumps({"version": version, "learner_step": version, "applied_entry_ids": []})
        )
    (root / "latest").write_text(f"v{versions[-1]:08d}")
    config = load_config(
        None,
        ["envs.name=frozenlake", "envs.panel_size=3", "envs.max_steps=3", "model.max_new_tokens=8", "run.id=evalsmoke"],
    )
    (run / "config.yaml").write_text(dump_config(config))
    if save_weights:
        model, tokenizer = load_model(SHIPPED) if shipped else tiny_model(seed=2)
        model.save_pretrained(root / f"v{versions[-1]:08d}" / "hf")
        tokenizer.save_pretrained(root / f"v{versions[-1]:08d}" / "hf")
    return run


def test_paths_resolve_to_the_newest_checkpoint_of_their_run(tmp_path):
    run = fake_run(tmp_path)
    newest = run / "learner" / "checkpoints" / "v00000003"
    for given in (run, run / "learner" / "checkpoints", newest):
        source = resolve_policy(str(given))
        assert (source.checkpoint, source.policy_version, source.run_dir) == (newest, 3, run)
        assert source.model_name == str(newest / "hf")
    older = resolve_policy(str(run / "learner" / "checkpoints" / "v00000002"))
    assert older.policy_version == 2 and older.run_dir == run
    plain = resolve_policy("smollm2-135m-instruct")
    assert (plain.model_name, plain.checkpoint, plain.policy_version, plain.run_dir) == (
        "smollm2-135m-instruct",
        None,
        0,
        None,
    )


def test_a_run_without_checkpoints_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="no complete learner checkpoint yet"):
        resolve_policy(str(run))


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_slea_eval_on_a_run_directory_writes_the_report(tmp_path, engine):
    """eval.engine picks the engine; stdout holds the JSON report alone, with vLLM's log lines too."""
    if engine == "vllm":
        vllm_python()
    run = fake_run(tmp_path, save_weights=True, shipped=engine == "vllm")
    out = tmp_path / "report"
    result = subprocess.run(
        [*SLEA, "eval", str(run), "--episodes-per-task", "2", "--k", "1", "--k", "2", "--out", str(out), "--json"]
        + ["--set", f"eval.engine={engine}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["env"] == "frozenlake" and report["panel"] == "default" and report["tasks"] == 3
    assert report["policy_version"] == 3 and report["checkpoint"].endswith("v00000003")
    assert report["settings"]["ks"] == [1, 2] and report["settings"]["budgets"] == [1, 3]
    assert report["library"].startswith("unavailable (run directory") and "has no library snapshot" in report["library"]
    played = [row for row in report["rows"] if row["available"]]
    assert [(row["decoding"], row["library"], row["episodes"]) for row in played] == [
        ("sampled", False, 6),
        ("greedy", False, 3),
    ]
    assert sorted(path.name for path in out.iterdir()) == [
        "pass_at_k_t.png",
        "report.json",
        "report.md",
        "success_by_task_type.png",
    ]


@pytest.mark.slow
def test_slea_eval_refuses_k_above_the_episodes_per_task(tmp_path):
    run = fake_run(tmp_path, save_weights=True)
    result = subprocess.run(
        [
            *SLEA,
            "eval",
            str(run),
            "--episodes-per-task",
            "2",
            "--k",
            "4",
            "--no-library",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "k values [4] need 1 <= k <= episodes per task (2)" in result.stderr
