"""Every pod the overlays start meets Pod Security "restricted" plus what the issue asks on top:
read-only root filesystems, requests and limits everywhere, service-account tokens only where
needed. Checked field by field on the rendered manifests (the scanner test checks the same
through checkov)."""

from __future__ import annotations

import re

import pytest
from k8s_render import OVERLAYS, pods, ray_cluster_specs

HEAD_GROUPS = {"head"}  # the autoscaler sidecar runs here and needs the token


def restricted_problems(where: str, container: dict, pod_security: dict) -> list[str]:
    security = container.get("securityContext", {})
    problems = []
    if security.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    if security.get("capabilities", {}).get("drop") != ["ALL"] or security.get("capabilities", {}).get("add"):
        problems.append("capabilities are not drop: [ALL]")
    if security.get("readOnlyRootFilesystem") is not True:
        problems.append("root filesystem is writable")
    if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
        problems.append("runAsNonRoot is not set")
    if (security.get("seccompProfile") or pod_security.get("seccompProfile", {})).get("type") != "RuntimeDefault":
        problems.append("seccompProfile is not RuntimeDefault")
    if security.get("privileged") or security.get("runAsUser") == 0 or pod_security.get("runAsUser") == 0:
        problems.append("privileged or root")
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        missing = {"cpu", "memory"} - set(resources.get(kind, {}))
        if missing:
            problems.append(f"no {kind} for {sorted(missing)}")
    return [f"{where}: {problem}" for problem in problems]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_restricted(rendered, overlay):
    problems = []
    for where, spec in pods(rendered[overlay]).items():
        pod_security = spec.get("securityContext", {})
        assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")), where
        assert not [v for v in spec.get("volumes", []) if "hostPath" in v], f"{where}: hostPath volume"
        for container in spec.get("initContainers", []) + spec["containers"]:
            problems += restricted_problems(f"{where} {container['name']}", container, pod_security)
    for doc in rendered[overlay]:  # the autoscaler sidecar KubeRay adds to each head pod
        if doc["kind"] in ("RayJob", "RayService"):
            (cluster,) = ray_cluster_specs([doc]).values()
            head_security = cluster["headGroupSpec"]["template"]["spec"]["securityContext"]
            problems += restricted_problems(
                f"{doc['metadata']['name']} autoscaler", cluster["autoscalerOptions"], head_security
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_account_tokens_only_on_ray_heads(rendered, overlay):
    for where, spec in pods(rendered[overlay]).items():
        needs_token = where.rsplit("/", 1)[-1] in HEAD_GROUPS
        assert spec.get("automountServiceAccountToken", True) is needs_token, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_writes_go_to_emptydirs(rendered, overlay):
    for where, spec in pods(rendered[overlay]).items():
        if where.startswith("StatefulSet/"):
            continue
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], f"{where}: /tmp is not an emptyDir"
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("HOME", "").startswith("/tmp/"), f"{where}: HOME is not on the writable /tmp"
            if container["name"].startswith("ray-") and not where.endswith("/submitter"):
                assert volumes[mounts["/dev/shm"]]["emptyDir"].get("medium") == "Memory", where


def _image_env(flavour: str) -> dict[str, str]:
    from test_dockerfiles import DOCKERFILES, instructions

    env = {}
    for name, rest in instructions(DOCKERFILES[flavour]):
        if name == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", rest))
    return env


def _writable(path: str, mounts: set[str]) -> bool:
    return any(path == mount or path.startswith(mount.rstrip("/") + "/") for mount in mounts)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_path_the_code_writes_at_run_time_is_on_a_mounted_volume(rendered, overlay, monkeypatch):
    """The root filesystem is read-only: the envs' run-time cache (slea/cache_dirs.py, where the
    code itself puts compiled TextWorld games and ALFWorld verdicts, with the image's environment),
    HOME's caches, the temp dir and run.dir must each lie on a volume every Ray pod mounts."""
    from k8s_render import entrypoint_config, find

    from actors.envs.alfworld.verification import cache_dir as verdicts
    from actors.envs.textworld_games import cache_dir as textworld_games

    image = _image_env("cpu" if overlay == "cpu-kind" else "gpu")
    for name, value in image.items():
        monkeypatch.setenv(name, value)
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    written = {
        "compiled TextWorld games": str(textworld_games()),
        "ALFWorld verdicts": str(verdicts()),
        "the temp dir": "/tmp",
    }
    assert not _writable(image["SLEA_CACHE_DIR"], {"/tmp", "/mnt/slea-runs"}), "the build cache is baked, read-only"
    for where, spec in pods(rendered[overlay]).items():
        if where.startswith("StatefulSet/") or where.endswith("/submitter"):
            continue
        for container in spec["containers"]:
            mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            paths = {**written, "HOME": env["HOME"]}
            if where.startswith("RayJob/") and where.rsplit("/", 1)[-1] in ("head", "learner", "library"):
                paths["run.dir"] = config.run.dir
            for what, path in paths.items():
                assert _writable(path, mounts), f"{where} {container['name']}: {what} ({path}) is on the read-only root"
