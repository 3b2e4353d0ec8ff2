"""scripts/gpu_check.sh, its shared parts (scripts/check_lib.sh) and summary.json
(scripts/check_summary.py), run here with stand-in Pythons: the GPU is the only thing missing.

It shows why CUDA is unusable in torch's own words (a driver too old for CUDA 13 is not "no GPU");
a failing probe does not stop the next, each keeps its log and the summary says which failed and
why; a dry run lists every probe with its timeout, each a test that exists."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from k8s_render import REPO

TOO_OLD = "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."
sys.path.insert(0, str(REPO / "scripts"))
import check_summary  # noqa: E402


def stand_in(tmp_path: Path, body: str) -> Path:
    """An executable sh script at tmp_path/python: what the check takes for its Python."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n" + body)
    python.chmod(0o755)
    return python


def gpu_check(tmp_path: Path, python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args, str(tmp_path / "out")], cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_torchs_warning_is_printed_when_cuda_is_unusable(tmp_path):
    python = stand_in(tmp_path, f"echo 'torch 2.13.0 built for CUDA 13.0'\necho '{TOO_OLD}' >&2\nexit 1\n")
    result = gpu_check(tmp_path, python, "--no-install")
    assert result.returncode == 2, result.stdout + result.stderr
    assert TOO_OLD in result.stderr and "built for CUDA 13.0" in result.stderr
    assert "driver >= 580" in result.stderr and "no nvidia-smi" in result.stderr
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    assert [(probe["name"], probe["status"]) for probe in summary["probes"]][:2] == [
        ("cuda", "failed"),
        ("nccl", "skipped"),
    ]
    assert {probe["reason"] for probe in summary["probes"][1:]} == {"CUDA is unusable (probe cuda)"}
    assert TOO_OLD in summary["probes"][0]["tail"], "the cause is in the summary too"
    assert result.stdout.rstrip().endswith("}"), "summary.json is printed last"


def test_a_failing_probe_does_not_stop_the_next_and_keeps_its_evidence(tmp_path):
    # CUDA is usable; the ZeRO-2 test fails with a cause that a late warning follows, the NCCL test
    # records figures, the others pass.
    python = stand_in(
        tmp_path,
        """case "$*" in
  *test_4_zero2*) echo "RuntimeError: the cause"; echo "UserWarning: late, after the cause" >&2; exit 1 ;;
  *test_7_nccl*) echo '{"nccl_rank": {"error": "refused", "seconds": 3.5}}' > "$SLEA_CHECK_FIGURES" ;;
esac
exit 0
""",
    )
    result = gpu_check(tmp_path, python, "--no-install")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out/summary.json").read_text())
    statuses = {probe["name"]: probe["status"] for probe in summary["probes"]}
    assert statuses == {
        "cuda": "passed", "nccl": "passed", "zero2_bf16_step": "failed", "vllm": "passed",
        "shared_gpu_bf16": "passed", "train_2_steps": "passed",
    }  # fmt: skip
    failed = next(probe for probe in summary["probes"] if probe["status"] == "failed")
    assert "RuntimeError: the cause" in failed["tail"] and "late, after the cause" in failed["tail"]
    assert summary["probes"][1]["figures"] == {"nccl_rank": {"error": "refused", "seconds": 3.5}}
    assert summary["counts"] == {"passed": 5, "failed": 1, "timeout": 0, "skipped": 0}
    files = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert len(files) <= 8, f"a device machine hands back at most 8 files: {files}"
    assert "3-vllm.log" in files and "environment.txt" in files


def test_the_dry_run_lists_each_probe_with_its_timeout_and_each_test_exists():
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    probes = re.findall(r"^\s+\d+\s+(\S+)\s+(\d+) s\s", result.stdout, re.MULTILINE)
    assert [name for name, _ in probes] == [
        "install", "cuda", "nccl", "zero2_bf16_step", "vllm", "shared_gpu_bf16", "train_2_steps",
    ]  # fmt: skip
    tier = (REPO / "tests/gpu/test_gpu_path.py").read_text()
    for test in re.findall(r"test_gpu_path\.py::(\w+)", result.stdout):
        assert f"def {test}(" in tier, f"the check runs {test}, which tests/gpu/test_gpu_path.py does not have"
    assert "pytest-xdist" in result.stdout, "pyproject's --dist loadgroup needs it"
    assert " -x" not in result.stdout


def test_the_summary_by_hand(tmp_path):
    summary = tmp_path / "summary.json"
    check_summary.start(summary, "device_check", 540)
    (tmp_path / "1-learner_step.log").write_text("".join(f"line {i}\n" for i in range(100)))
    figures = tmp_path / "figures.json"
    figures.write_text('{"tokens_per_s": 1234.5}')
    started = time.time() - 2.0
    check_summary.add(summary, "learner_step", "passed", started, 240, "1-learner_step.log", figures)
    check_summary.add(summary, "engine_and_handoff", "timeout", started, 180, "1-learner_step.log", tmp_path / "none")
    check_summary.add(summary, "later", "skipped", 0, 60, "", "", "under 20 s of the check's 540 s deadline was left")
    state = check_summary.finish(summary)
    passed, timed_out, skipped = state["probes"]
    assert passed["figures"] == {"tokens_per_s": 1234.5} and "tail" not in passed
    assert 2.0 <= passed["seconds"] < 10 and passed["timeout_s"] == 240.0
    assert timed_out["tail"].splitlines() == [f"line {i}" for i in range(60, 100)]  # the last 40 lines
    assert "figures" not in timed_out
    assert skipped == {
        "name": "later", "status": "skipped", "seconds": 0.0, "timeout_s": 60.0, "log": None,
        "reason": "under 20 s of the check's 540 s deadline was left",
    }  # fmt: skip
    assert state["status"] == "failed" and state["counts"] == {"passed": 1, "failed": 0, "timeout": 1, "skipped": 1}
    assert json.loads(summary.read_text()) == state
    printed = subprocess.run(
        [sys.executable, str(REPO / "scripts/check_summary.py"), "finish", str(summary)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert printed.returncode == 1  # not every probe passed
