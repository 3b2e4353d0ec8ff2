"""A test whose tool is missing skips on a developer's clone, saying how to install it, and fails
under CI (tests/conftest.py, tests/required_tools.py); .ci/run turns CI on and names the KubeRay
CRDs. Each case runs pytest on a small test file, with the suite's conftest, in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NEEDS_TOOLS = """
from required_tools import kuberay_crds, promtool

def test_needs_promtool():
    promtool()

def test_needs_the_crds():
    kuberay_crds()
"""


def run_pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_tools.py").write_text(NEEDS_TOOLS)
    environment = {key: value for key, value in os.environ.items() if key not in ("CI", "SLEA_KUBERAY_CRDS")}
    # a PATH without promtool (required_tools looks in the venv's bin first, which has none)
    environment |= {"PATH": str(tmp_path), "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "test_needs_tools.py"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_tool_skips_with_how_to_install_it_on_a_developers_clone(tmp_path):
    result = run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 skipped" in result.stdout, result.stdout
    assert "promtool not found: apt-get install prometheus" in result.stdout
    assert "set SLEA_KUBERAY_CRDS to a directory holding ray.io_rayclusters.yaml" in result.stdout


def test_a_missing_tool_fails_under_ci(tmp_path):
    result = run_pytest(tmp_path, CI="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], result.stdout
    assert "skipped under CI (CI=true), where every test must run: promtool not found" in result.stdout
    assert "skipped under CI (CI=true), where every test must run: KubeRay CRDs not given" in result.stdout


def test_crds_named_but_not_there_fail_even_off_ci(tmp_path):
    result = run_pytest(tmp_path, SLEA_KUBERAY_CRDS=str(tmp_path / "nowhere"))
    assert "1 failed" in result.stdout and "1 skipped" in result.stdout, result.stdout
    assert f"SLEA_KUBERAY_CRDS={tmp_path / 'nowhere'} lacks ray.io_rayclusters.yaml" in result.stdout


def test_ci_run_is_strict_and_names_the_crds_beside_the_clone():
    script = (REPO / ".ci/run").read_text()
    pytest_at = script.index(".venv/bin/python -m pytest")
    assert 0 < script.index("export CI=true") < pytest_at
    assert (
        0
        < script.index('export SLEA_KUBERAY_CRDS="${SLEA_KUBERAY_CRDS:-$(cd .. && pwd)/shared/schemas/kuberay}"')
        < pytest_at
    )
