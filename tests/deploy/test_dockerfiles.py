"""The images, checked without a Docker engine: hadolint, every COPY source exists in the build
context, a non-root user, no secrets, pinned versions as build args that agree with the setup
script, the configs and the manifests."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_render import IMAGE_WORKDIR, REPO
from required_tools import hadolint

from slea.config import load_config

DOCKERFILES = {"cpu": REPO / "deploy/docker/Dockerfile.cpu", "gpu": REPO / "deploy/docker/Dockerfile.gpu"}
SECRET_WORDS = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            if current.strip():
                joined.append(current)
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in joined]


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a FROM starts one), the runtime image's last."""
    found: list[list[tuple[str, str]]] = []
    for name, rest in instructions(path):
        if name == "FROM":
            found.append([])
        if found:
            found[-1].append((name, rest))
    return found


def build_args(path: Path) -> dict[str, str]:
    """ARG defaults (the last declaration wins, as after a FROM)."""
    args = {}
    for name, rest in instructions(path):
        if name == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key.strip()] = value.strip().strip('"')
    return args


def dockerignored() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_hadolint_is_clean(flavour):
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILES[flavour])], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_every_copy_source_is_in_the_build_context(flavour):
    ignored = dockerignored()
    copies = [rest for name, rest in instructions(DOCKERFILES[flavour]) if name in ("COPY", "ADD")]
    assert copies
    for rest in copies:
        parts = [part for part in rest.split() if not part.startswith("--")]
        for source in parts[:-1]:
            path = REPO / source
            assert path.exists(), f"{flavour}: COPY {source} does not exist in the build context (the repository root)"
            assert not any(fnmatch.fnmatch(source.rstrip("/"), pattern) for pattern in ignored), (
                f"{source} is .dockerignored"
            )


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_every_package_the_project_installs_is_copied(flavour):
    """pip installs what pyproject's package list finds: a package left out of the COPYs is missing
    from the image, and `slea` fails there on its first import of it."""
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in patterns}
    copied = {
        part.rstrip("/")
        for name, rest in instructions(DOCKERFILES[flavour])
        if name == "COPY"
        for part in rest.split()[:-1]
        if not part.startswith("--")
    }
    assert packages - copied == set(), f"{flavour}: COPY these packages into the image: {sorted(packages - copied)}"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_runs_as_non_root_and_ships_no_secrets(flavour):
    steps = instructions(DOCKERFILES[flavour])
    args = build_args(DOCKERFILES[flavour])
    users = [rest for name, rest in steps if name == "USER"]
    final_user = re.sub(r"\$\{(\w+)\}", lambda match: args[match.group(1)], users[-1])
    assert final_user not in ("root", "0"), f"{flavour}: the image must end as a non-root user, ends as {final_user}"
    for name, rest in steps:
        if name in ("ENV", "ARG", "LABEL"):
            assert not SECRET_WORDS.search(rest), f"{flavour}: {name} {rest} looks like a secret"
        if name in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|id_rsa|\.pem|\.key\b|secret", rest, re.I), f"{flavour}: copies {rest}"
    assert (REPO / ".dockerignore").is_file() and ".git" in dockerignored()


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_versions_come_from_the_constraints_file(flavour):
    """No package version as a build arg (it would drift from constraints.txt): only Ray's, which
    names the GPU base image, and it must be the pinned and installed Ray the manifests ask for."""
    from importlib.metadata import version

    args = build_args(DOCKERFILES[flavour])
    assert not {name for name in args if name.endswith("_VERSION")} - {"RAY_VERSION", "PYTHON_VERSION"}
    ray_pin = re.search(r"^ray==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
    rayjob = (REPO / "deploy/k8s/base/rayjob.yaml").read_text()
    assert f'rayVersion: "{ray_pin}"' in rayjob and ray_pin == version("ray")
    if flavour == "gpu":
        assert args["RAY_VERSION"] == ray_pin
        assert args["MODEL_ID"] == load_config(REPO / "configs/cluster.yaml").model.name


SOURCE_DIRS = ("slea/", "actors/", "learner/", "library/", "monitoring/")


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_dependencies_and_model_come_before_the_source(flavour):
    """Layers from what changes least to what changes most: a code change must rebuild only the
    source layers at the end, never the dependency install or the model bake. Before the source
    only constraints.txt, pyproject.toml and the model converter (slea/models.py and the cache
    location it reads, slea/cache_dirs.py) are copied."""
    steps = instructions(DOCKERFILES[flavour])
    copies = [(i, rest.split()[-2]) for i, (name, rest) in enumerate(steps) if name == "COPY"]
    first_source = min(i for i, source in copies if source in SOURCE_DIRS)
    runs = {i: rest for i, (name, rest) in enumerate(steps) if name == "RUN"}
    dependencies = min(i for i, rest in runs.items() if "-r /tmp/requirements.txt" in rest)
    bake = min(i for i, rest in runs.items() if "resolve_checkpoint" in rest)
    assert dependencies < bake < first_source
    early = {
        source
        for rest in steps[:bake]
        if rest[0] == "COPY"
        for source in rest[1].split()[:-1]
        if not source.startswith("--")
    }
    assert early == {"constraints.txt", "pyproject.toml", "slea/models.py", "slea/cache_dirs.py"}, early
    assert "tomllib" in runs[dependencies], "dependencies are read from pyproject.toml, the source is not there yet"
    late = [rest for i, rest in runs.items() if i > first_source]
    assert late == ["pip install --no-cache-dir -c constraints.txt --no-deps ."], (
        f"after the source, only the project itself may be installed (no dependencies): {late}"
    )


def _ignored(path: str) -> bool:
    """Whether Docker leaves PATH out of the build context: .dockerignore patterns are Go
    filepath.Match globs from the context root, where `**` matches any number of directories."""
    for pattern in dockerignored():
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if re.fullmatch(regex + "(/.*)?", path):
            return True
    return False


@pytest.mark.parametrize(
    "path",
    [
        ".venv",
        ".venv-checkov",
        ".venv-one/bin/python",
        "tools/.venv-x/lib",
        ".git",
        "slea/__pycache__/x.pyc",
    ],
)
def test_dockerignore_leaves_out_every_virtualenv(path):
    assert _ignored(path), f"{path} would be sent into the image build"


@pytest.mark.parametrize(
    "path", ["constraints.txt", "pyproject.toml", "slea/models.py", "slea/cache_dirs.py", "configs/cluster.yaml"]
)
def test_dockerignore_keeps_what_the_images_copy(path):
    assert not _ignored(path)


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_image_layout_matches_the_manifests(flavour):
    steps = instructions(DOCKERFILES[flavour])
    assert [rest for name, rest in steps if name == "WORKDIR"][-1] == IMAGE_WORKDIR
    assert ("COPY", "configs/ configs/") in [(n, r.split(" ", 1)[1] if r.startswith("--") else r) for n, r in steps]
    exposed = {int(port) for name, rest in steps if name == "EXPOSE" for port in rest.split()}
    manifests = "".join((REPO / "deploy/k8s/base" / name).read_text() for name in ("rayjob.yaml", "rayservice.yaml"))
    assert {int(port) for port in re.findall(r"containerPort: (\d+)", manifests)} <= exposed
    uid = build_args(DOCKERFILES[flavour])["SLEA_UID"]
    assert set(re.findall(r"runAsUser: (\d+)", manifests)) == {uid}
    env = " ".join(rest for name, rest in steps if name == "ENV")
    cache_dirs = (REPO / "slea/cache_dirs.py").read_text()
    assert "SLEA_CACHE_DIR=" in env and "SLEA_CACHE_DIR" in cache_dirs
    assert "SLEA_RUNTIME_CACHE_DIR=/tmp/" in env and "SLEA_RUNTIME_CACHE_DIR" in cache_dirs
    assert "HF_HUB_OFFLINE=1" in env, "a pod never downloads a model"


# The config each image runs on its own (a `docker run` of the image, no cluster around it).
STANDALONE_CONFIGS = {"gpu": REPO / "configs/gpu.yaml"}


def _installed_apt_packages(flavour: str, stage: int = -1) -> set[str]:
    """What apt installs in one build stage (the runtime image by default)."""
    packages = set()
    for name, rest in stages(DOCKERFILES[flavour])[stage]:
        if name == "RUN":
            for command in re.findall(r"apt-get install ([^&;]+)", rest):
                packages |= {word for word in command.split() if not word.startswith("-")}
    return packages


@pytest.mark.parametrize("flavour", STANDALONE_CONFIGS)
def test_an_embedded_redis_config_gets_a_redis_server_in_its_image(flavour):
    """configs/gpu.yaml sets redis.url: null (the CLI starts redis-server itself): redis-tools alone
    (redis-cli) stops the run at start-up."""
    config = load_config(STANDALONE_CONFIGS[flavour])
    assert config.redis.url is None, "the standalone config no longer embeds Redis: this test is moot"
    assert "redis-server" in _installed_apt_packages(flavour), f"{flavour}: installs {_installed_apt_packages(flavour)}"


@pytest.mark.parametrize("flavour", STANDALONE_CONFIGS)
def test_the_run_directory_exists_and_belongs_to_the_run_user(flavour):
    """A fresh named volume mounted on a path the image has takes that path's owner; on a path the
    image lacks it is root's, and the run (uid SLEA_UID) cannot create its run directory."""
    run_dir = str(load_config(STANDALONE_CONFIGS[flavour]).run.dir)
    runs = [rest for name, rest in instructions(DOCKERFILES[flavour]) if name == "RUN"]
    made = [rest for rest in runs if re.search(rf"mkdir -p [^&]*{re.escape(run_dir)}\b", rest)]
    assert made, f"{flavour}: no RUN makes {run_dir}"
    assert re.search(rf'chown -R "\$\{{SLEA_UID\}}" [^&]*{re.escape(run_dir)}\b', made[0]), (
        f"{flavour}: {run_dir} is made but not given to the run user"
    )


BUILD_TOOLS = {"g++", "cmake", "make", "build-essential"}
C_COMPILERS = {"gcc", "clang"}  # what Triton's _build() looks for on PATH when CC is unset


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_the_runtime_image_has_no_build_tools(flavour):
    """Multi-stage: the source packages are built into wheels in a stage of their own, which the
    runtime stage installs from a build-time mount; no build tool is in the image that runs. The
    CPU image has no compiler at all; the GPU image has the C compiler Triton runs (next tests)."""
    all_stages = stages(DOCKERFILES[flavour])
    assert len(all_stages) >= 2, f"{flavour}: one stage: the compilers stay in the image"
    assert BUILD_TOOLS & _installed_apt_packages(flavour, 0), f"{flavour}: the wheels stage builds nothing"
    assert not BUILD_TOOLS & _installed_apt_packages(flavour), f"{flavour}: build tools in the runtime image"
    if flavour == "cpu":
        assert not C_COMPILERS & _installed_apt_packages(flavour), f"{flavour}: a compiler in the runtime image"
    runtime_installs = [rest for name, rest in all_stages[-1] if name == "RUN" and "-r /tmp/requirements.txt" in rest]
    assert runtime_installs and all(
        "--mount=type=bind,from=wheels" in rest and "--no-index --find-links /wheels" in rest
        for rest in runtime_installs
    ), f"{flavour}: the runtime stage must install the wheels stage's wheels, offline"


def _triton_probe() -> str:
    """The GPU runtime stage's RUN that builds a Python extension with Triton's own builder."""
    runtime = stages(DOCKERFILES["gpu"])[-1]
    runs = [rest for name, rest in runtime if name == "RUN"]
    probes = [rest for rest in runs if "compile_module_from_src" in rest]
    assert len(probes) == 1, "the GPU runtime stage must compile a Python extension through Triton's builder"
    dependencies = next(i for i, rest in enumerate(runs) if "-r /tmp/requirements.txt" in rest)
    assert runs.index(probes[0]) > dependencies, "the Triton probe must run after torch (and Triton) are installed"
    return probes[0]


def test_the_gpu_runtime_has_what_triton_compiles_with():
    """vLLM 0.32 takes its V2 model runner whenever Triton imports, and fp32 attention is Triton's or
    Flex's; Triton compiles its CUDA utilities and each kernel's launcher with a C compiler and the
    running Python's Python.h the first time a kernel runs. The runtime stage installs the C
    compiler Triton finds and the C headers (only a Recommends of gcc), and its build compiles a
    Python extension with Triton's builder and the image's own python, the one pip installs into:
    Python.h must be that interpreter's (the conda Python 3.N of Ray's image for PYTHON_TAG py3N,
    headers included), which no apt package provides."""
    packages = _installed_apt_packages("gpu")
    assert C_COMPILERS & packages, f"gpu: no C compiler for Triton's launcher in the runtime image: {packages}"
    assert "libc6-dev" in packages, "gpu: gcc without libc6-dev (a Recommends, left out) cannot compile"
    runtime = stages(DOCKERFILES["gpu"])[-1]
    assert runtime[0][1].startswith("rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}-"), runtime[0]
    assert re.fullmatch(r"py3\d+", build_args(DOCKERFILES["gpu"])["PYTHON_TAG"]), "Ray's tag for its Python 3.N"
    assert not any(re.fullmatch(r"(lib)?python3(\.\d+)?-dev", package) for package in packages), (
        "apt's Python headers are not the base Python's (conda's), whose include dir Triton passes"
    )
    probe = _triton_probe()
    assert re.search(r'TRITON_CACHE_DIR="\$\{cache\}" python -c ', probe), (
        "run by the image's python, in a scratch cache"
    )


def _run_probe(path: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The probe as the Dockerfile's SHELL runs it, with PATH as given and no CC."""
    env = {"PATH": path, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    return subprocess.run(
        ["/bin/bash", "-o", "pipefail", "-c", _triton_probe()], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_triton_probe_builds_with_a_compiler_and_fails_without_one(tmp_path):
    """The Dockerfile's probe, run here with this venv's Python and Triton (the image's versions):
    it builds where gcc is on PATH and stops the build where it is not."""
    triton = pytest.importorskip("triton")
    pin = re.search(r"^triton==(\S+)", (REPO / "constraints.txt").read_text(), re.M).group(1)
    assert triton.__version__ == pin, f"the venv's Triton {triton.__version__}, the image's {pin}"
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: apt-get install gcc (scripts/setup.sh installs it)")
    venv = Path(sys.executable).parent
    built = _run_probe(f"{venv}{os.pathsep}{Path(gcc).parent}{os.pathsep}/usr/bin{os.pathsep}/bin", tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    bare = tmp_path / "bin"  # python, mktemp and rm, and no compiler
    bare.mkdir()
    (bare / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bare / "python").chmod(0o755)
    for program in ("mktemp", "rm"):
        (bare / program).symlink_to(shutil.which(program))
    refused = _run_probe(str(bare), tmp_path)
    assert refused.returncode != 0 and "Failed to find C compiler" in refused.stderr, refused.stderr


def test_triton_caches_where_the_run_user_can_write():
    """Triton writes its compiled launchers to TRITON_CACHE_DIR, else TRITON_HOME or HOME's
    .triton/cache (triton/knobs.py). The image leaves HOME the base's (/home/ray, the run user's);
    an ENV that moves one must point at /tmp (writable in every pod) or at a directory the image
    gives the run user."""
    steps = instructions(DOCKERFILES["gpu"])
    env = {}
    for name, rest in steps:
        if name == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(rest) if "=" in item)
    runs = " ".join(rest for name, rest in steps if name == "RUN")
    for key in ("TRITON_CACHE_DIR", "TRITON_HOME", "HOME"):
        if key in env:
            path = env[key]
            given = re.search(rf'chown -R "\$\{{SLEA_UID\}}" [^&]*{re.escape(path)}\b', runs)
            assert path.startswith("/tmp/") or given, f"gpu: {key}={path} is not writable by the run user"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_torch_comes_from_its_own_index_with_no_extra_index_beside_pypi(flavour):
    """--extra-index-url lets pip take any package from either index (dependency confusion); the
    CPU torch comes from its index by --index-url, alone, and everything else from PyPI."""
    text = " ".join(rest for name, rest in instructions(DOCKERFILES[flavour]) if name == "RUN")
    assert "--extra-index-url" not in text
    if flavour == "cpu":
        assert re.search(r'pip wheel [^&]*--index-url "\$\{TORCH_INDEX_URL\}"[^&]* torch ', text), (
            "the CPU torch comes from TORCH_INDEX_URL by --index-url"
        )
        assert build_args(DOCKERFILES[flavour])["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_the_gpu_model_is_baked_at_a_pinned_revision():
    """A model repository's main branch moves; the image bakes one commit and points refs/main at
    it, so the offline pods load exactly that commit by the name the config gives."""
    args = build_args(DOCKERFILES["gpu"])
    assert re.fullmatch(r"[0-9a-f]{40}", args["MODEL_REVISION"]), args["MODEL_REVISION"]
    bake = [rest for name, rest in instructions(DOCKERFILES["gpu"]) if name == "RUN" and "snapshot_download" in rest]
    assert len(bake) == 1
    assert "revision='${MODEL_REVISION}'" in bake[0] and '> "${refs}/main"' in bake[0]
