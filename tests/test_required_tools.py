"""A test whose tool is missing skips on a developer's clone, saying how to install it, and fails
under CI (tests/conftest.py, tests/required_tools.py); .ci/run turns CI on and names the KubeRay
CRDs. The CI case runs pytest, with the suite's conftest, on a small test file in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import required_tools

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NEEDS_TOOLS = """
from required_tools import kuberay_crds, promtool

def test_needs_promtool():
    promtool()

def test_needs_the_crds():
    kuberay_crds()
"""
SKIPPED_MODULE = """
import pytest

pytest.importorskip("no_such_package", reason="no_such_package not installed: pip install it")
"""


def run_pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_tools.py").write_text(NEEDS_TOOLS)
    (tmp_path / "test_skipped_module.py").write_text(SKIPPED_MODULE)
    environment = {key: value for key, value in os.environ.items() if key not in ("CI", "SLEA_KUBERAY_CRDS")}
    # a PATH without promtool (required_tools looks in the venv's bin first, which has none)
    environment |= {"PATH": str(tmp_path), "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--continue-on-collection-errors"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_tool_skips_with_how_to_install_it_on_a_developers_clone(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(required_tools, "VENV_BIN", Path("/nonexistent"))
    monkeypatch.delenv(required_tools.CRDS_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool not found: apt-get install prometheus"):
        required_tools.promtool()
    with pytest.raises(pytest.skip.Exception, match="set SLEA_KUBERAY_CRDS to a directory holding ray.io_rayclusters"):
        required_tools.kuberay_crds()


def test_crds_named_but_not_there_fail_even_off_ci(monkeypatch, tmp_path):
    monkeypatch.setenv(required_tools.CRDS_VARIABLE, str(tmp_path))
    (tmp_path / "ray.io_rayjobs.yaml").write_text("{}")
    with pytest.raises(pytest.fail.Exception, match="lacks ray.io_rayclusters.yaml, ray.io_rayservices.yaml"):
        required_tools.kuberay_crds()


def test_under_ci_every_skip_is_a_failure_naming_what_is_missing(tmp_path):
    """The suite's conftest, with CI=true, on a file whose two tests skip and a module skipped as it
    is collected: all three fail, naming why."""
    result = run_pytest(tmp_path, CI="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 1 error" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], result.stdout
    assert "where every test must run: no_such_package not installed: pip install it" in result.stdout
    assert "skipped under CI (CI=true), where every test must run: promtool not found" in result.stdout
    assert "skipped under CI (CI=true), where every test must run: KubeRay CRDs not given" in result.stdout


def test_ci_run_is_strict_and_names_the_crds_beside_the_clone():
    script = (REPO / ".ci/run").read_text()
    pytest_at = script.index(".venv/bin/python -m pytest")
    assert 0 < script.index("export CI=true") < pytest_at
    assert (
        0
        < script.index('export SLEA_KUBERAY_CRDS="${SLEA_KUBERAY_CRDS:-$(cd .. && pwd)/shared/schemas/kuberay}"')
        < pytest_at
    )
