"""scripts/gpu_check.sh shows why CUDA is unusable in torch's own words (a driver too old for
CUDA 13 is not "no GPU"), checked here with a stand-in Python that fails as torch does."""

from __future__ import annotations

import subprocess

from k8s_render import REPO

TOO_OLD = "UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."


def test_torchs_warning_is_printed_when_cuda_is_unusable(tmp_path):
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho 'torch 2.13.0 built for CUDA 13.0'\necho '{TOO_OLD}' >&2\nexit 1\n")
    python.chmod(0o755)
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert TOO_OLD in result.stderr and "built for CUDA 13.0" in result.stderr
    assert "driver >= 580" in result.stderr and "no nvidia-smi" in result.stderr
