"""The house's arrows run one way (docs/architecture.md "Layout"), and the code is linted and formatted:
import-linter's contracts (.importlinter), ruff's lint and ruff's formatter, as pre-commit runs them."""

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    executable = BIN / tool
    if not executable.exists():
        pytest.fail(f"{tool} is not installed beside {sys.executable}: run `scripts/setup.sh --dev`")
    return subprocess.run([str(executable), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    result = run("lint-imports", "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_contracts_list_every_module_of_the_spine():
    """slea/ is the floor: every module in it is a contract, so it must be in the contract that keeps
    contracts free of components (else it could import one unseen), and it holds no subpackage (the
    driver, the roof, is its own package: driver/)."""
    contracts = configparser.ConfigParser()
    contracts.read(REPO / ".importlinter")
    listed = set(contracts["importlinter:contract:contracts-import-no-component"]["source_modules"].split())
    spine = {f"slea.{path.stem}" for path in (REPO / "slea").glob("*.py") if path.stem != "__init__"}
    assert spine - listed == set(), (
        f"add these to .importlinter's contracts-import-no-component: {sorted(spine - listed)}"
    )
    assert "monitoring" in listed
    subpackages = [path.name for path in (REPO / "slea").iterdir() if (path / "__init__.py").exists()]
    assert subpackages == [], f"slea/ holds only contracts; move {subpackages} out (the driver lives in driver/)"


def test_ruff_lint_passes():
    result = run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-4000:]


def test_ruff_format_is_applied():
    result = run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout[-4000:]
