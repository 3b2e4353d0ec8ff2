"""The container images of the deployment, laid out on this machine for the pod sandbox
(tests/deploy/pod_sandbox.py): no image can be pulled or built here, so each image is this
machine's programs and the project's checkout, bound at the paths the image has them.

The CPU image (deploy/docker/Dockerfile.cpu) maps as the table IMAGE_PATHS says. Its WORKDIR, ENV,
USER and the model it bakes are read from the Dockerfile itself, and tests/deploy/
test_image_layout.py checks the table against it, so the runner cannot drift from the image:

| in the image                                  | on this machine                                         |
|-----------------------------------------------|---------------------------------------------------------|
| /app (WORKDIR; COPY slea/ driver/ configs/...) | the checkout, read-only (also at its own path, where    |
|                                               | the venv's editable install and scripts point)          |
| /usr/local (python, `pip install .`: slea, ray)| the venv's interpreter prefix, and the venv first on   |
|                                               | PATH                                                    |
| SLEA_CACHE_DIR /opt/slea-cache (baked model)  | a directory the Dockerfile's own bake command fills     |
|                                               | (or the tiny test policy: bake_tiny_policy)             |
| HF_HOME /opt/hf                               | an empty directory (HF_HUB_OFFLINE=1: nothing fetched)  |
| the OS (Debian: bash, wget, redis-tools)      | this machine's /usr, /etc, /bin, /lib, /lib64, /sbin    |

The Redis image (redis:7.2-bookworm) is this machine's redis-server and redis-cli (Debian's 7.0),
run as the image's redis user (999); the exporter image is Debian's prometheus-redis-exporter.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE_CPU = REPO / "deploy" / "docker" / "Dockerfile.cpu"
OS_DIRECTORIES = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the python base image's PATH
# Image path -> what stands for it here; test_image_layout.py checks it against Dockerfile.cpu.
IMAGE_PATHS = {
    "/app": "the checkout (read-only)",
    "/opt/slea-cache": "the baked model directory (read-only)",
    "/opt/hf": "an empty hub cache (read-only)",
}


@dataclass
class Dockerfile:
    """What of a Dockerfile's final stage a container sees: WORKDIR, ENV, USER, COPY destinations
    and RUN lines."""

    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    user: str = "0"
    copies: list[tuple[str, str]] = field(default_factory=list)  # (source, destination)
    runs: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)


def read_dockerfile(path: Path) -> Dockerfile:
    """The final stage of `path`, its line continuations joined, ARG defaults substituted."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stage, global_args, staged = Dockerfile(), {}, False
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        known = {**global_args, **stage.args}
        rest = re.sub(
            r"\$\{(\w+)\}|\$(\w+)", lambda m, known=known: known.get(m.group(1) or m.group(2), m.group(0)), rest
        )
        if instruction == "FROM":
            stage, staged = Dockerfile(), True
        elif instruction == "ARG":
            name, _, default = rest.partition("=")
            (stage.args if staged else global_args)[name] = default
        elif instruction == "WORKDIR":
            stage.workdir = rest
        elif instruction == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                stage.env[key] = value
        elif instruction == "USER":
            stage.user = rest
        elif instruction == "COPY":
            parts = [part for part in shlex.split(rest) if not part.startswith("--")]
            stage.copies += [(source, parts[-1]) for source in parts[:-1]]
        elif instruction == "RUN":
            stage.runs.append(rest)
    return stage


def bake_command(dockerfile: Dockerfile) -> str:
    """The Dockerfile's `python -c "..."` that converts the shipped model into SLEA_CACHE_DIR."""
    for run in dockerfile.runs:
        if match := re.search(r'python -c "([^"]*resolve_checkpoint[^"]*)"', run):
            return match.group(1)
    raise AssertionError("Dockerfile.cpu no longer bakes the model with resolve_checkpoint")


@dataclass
class ImageLayout:
    """One image as this machine provides it to a sandbox."""

    workdir: str
    env: dict[str, str]
    uid: int
    gid: int
    binds: list[tuple[str, str]]  # (this machine's path, the image's path), read-only
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    def mounts(self, volume_paths: list[str]) -> tuple[list[str], list[str], list[str]]:
        """bwrap arguments: the OS read-only, then the image's own paths (their parents 0755,
        as an image's directories are: bwrap would copy this machine's modes, /root's 0700); and
        the directories to remount read-only once the volumes are in. A container runtime makes
        a volume's mount point in the image (/etc/slea-redis): an OS directory that holds one is
        laid out entry by entry on a tmpfs, so the point can be made there. The third list goes
        after the volumes: the image's paths that lie under one."""
        mounts: list[str] = []
        exploded = []
        for directory in OS_DIRECTORIES:
            if os.path.islink(directory):
                mounts += ["--symlink", os.readlink(directory), directory]
            elif any(path.startswith(directory + "/") for path in volume_paths):
                mounts += ["--tmpfs", directory]
                for entry in sorted(Path(directory).iterdir()):
                    mounts += (
                        ["--symlink", os.readlink(entry), str(entry)]
                        if entry.is_symlink()
                        else ["--ro-bind", str(entry), str(entry)]
                    )
                exploded.append(directory)
            elif os.path.isdir(directory):
                mounts += ["--ro-bind", directory, directory]
        made = set(OS_DIRECTORIES)
        over_volumes: list[str] = []
        for source, target in self.binds:
            # A path of this machine under a volume's mount point (a checkout cloned into /tmp, its
            # venv with it) goes on top of the volume, after it is mounted, or the volume hides it.
            under_volume = any(target.startswith(path.rstrip("/") + "/") for path in volume_paths)
            into = over_volumes if under_volume else mounts
            for parent in reversed(Path(target).parents):
                if (
                    str(parent) != "/"
                    and str(parent) not in made
                    and not str(parent).startswith(tuple(d + "/" for d in OS_DIRECTORIES))
                    and not any(str(parent).rstrip("/") == path.rstrip("/") for path in volume_paths)
                ):
                    into += ["--perms", "0755", "--dir", str(parent)]
                    made.add(str(parent))
            into += ["--ro-bind", source, target]
        for path in volume_paths:  # their parents too (bwrap would make them 0700)
            for parent in map(str, reversed(Path(path).parents)):
                inside_os = parent.startswith(tuple(d + "/" for d in OS_DIRECTORIES if d not in exploded))
                if parent not in made and parent not in {"/", "/dev", "/proc", *OS_DIRECTORIES} and not inside_os:
                    mounts += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
        if self.workdir not in made and self.workdir not in {target for _, target in self.binds}:
            mounts += ["--perms", "0755", "--dir", self.workdir]  # WORKDIR: the image has it
        return mounts, exploded, over_volumes

    def command(self, container: dict, env: dict[str, str]) -> list[str]:
        """Kubernetes' rule: `command` replaces ENTRYPOINT, `args` replaces CMD; $(VAR) expands."""
        argv = (container.get("command") or self.entrypoint) + (
            container.get("args") or ([] if container.get("command") else self.cmd)
        )
        return [
            re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg) for arg in argv
        ]


def interpreter_prefix() -> str:
    """Where the venv's interpreter lives (sys.base_prefix): its symlinks point there."""
    return sys.base_prefix


TINY_POLICY = "/opt/slea-cache/tiny-policy"  # bake_tiny_policy's model, as the pods see it


def image_caches(directory: Path) -> dict[str, Path]:
    """Image path -> the empty directory under `directory` standing for it: SLEA_CACHE_DIR, HF_HOME."""
    dockerfile = read_dockerfile(DOCKERFILE_CPU)
    baked = {"/opt/slea-cache": directory / "slea-cache", "/opt/hf": directory / "hf"}
    assert dockerfile.env["SLEA_CACHE_DIR"] in baked and dockerfile.env["HF_HOME"] in baked
    for path in baked.values():
        path.mkdir(parents=True, exist_ok=True)
    return baked


def _readable(baked: dict[str, Path]) -> dict[str, Path]:
    """An image's files are readable by every user: the pods run as 1000, not as this test's root."""
    for path in baked.values():
        subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    return baked


def bake(directory: Path) -> dict[str, Path]:
    """Run Dockerfile.cpu's model bake into `directory`: image path -> the directory standing for it."""
    baked = image_caches(directory)
    env = {**os.environ, "SLEA_CACHE_DIR": str(baked["/opt/slea-cache"]), "HF_HOME": str(baked["/opt/hf"])}
    subprocess.run(
        [sys.executable, "-c", bake_command(read_dockerfile(DOCKERFILE_CPU))],
        check=True,
        env=env,
        cwd=REPO,
        timeout=900,
        capture_output=True,
    )
    return _readable(baked)


def bake_tiny_policy(directory: Path) -> dict[str, Path]:
    """The image's caches holding the tiny test policy at TINY_POLICY instead of the shipped model,
    as an image built to serve a model of one's own bakes it (`model.name` then names its path):
    for tests whose assertions are about the deployment, not about what the policy plays."""
    from slea.models import tiny_model

    baked = image_caches(directory)
    policy, tokenizer = tiny_model(seed=1)
    target = baked["/opt/slea-cache"] / Path(TINY_POLICY).name
    policy.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return _readable(baked)


def slea_image(baked: dict[str, Path]) -> ImageLayout:
    """deploy/docker/Dockerfile.cpu's final image, as the table above maps it."""
    dockerfile = read_dockerfile(DOCKERFILE_CPU)
    venv = Path(sys.prefix)
    uid = int(dockerfile.user)
    binds = [(interpreter_prefix(), interpreter_prefix()), (str(REPO), dockerfile.workdir), (str(REPO), str(REPO))]
    binds += [(str(source), target) for target, source in baked.items()]
    env = {"PATH": f"{venv}/bin:{IMAGE_PATH}", "HOME": "/home/slea", **dockerfile.env}
    return ImageLayout(workdir=dockerfile.workdir, env=env, uid=uid, gid=uid, binds=binds, cmd=["slea", "--help"])


def redis_image() -> ImageLayout:
    """redis:7.2-bookworm: its entrypoint execs the arguments (as the redis user it runs as)."""
    return ImageLayout(workdir="/data", env={"PATH": IMAGE_PATH}, uid=999, gid=999, binds=[], cmd=["redis-server"])


def redis_exporter_image() -> ImageLayout:
    """oliver006/redis_exporter: ENTRYPOINT the exporter binary (Debian's build here)."""
    binary = subprocess.run(
        ["sh", "-c", "command -v prometheus-redis-exporter"], capture_output=True, text=True
    ).stdout.strip()
    return ImageLayout(workdir="/", env={"PATH": IMAGE_PATH}, uid=59000, gid=59000, binds=[], entrypoint=[binary])
