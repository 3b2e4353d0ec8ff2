"""The GPU overlay places pods as a GPU cluster needs: GPU pods on GPU nodes (node affinity and
the taint's toleration), every other pod kept off them, all from one file (gpu-nodes.yaml);
Ray's object store on a memory-backed /dev/shm; no apply before the API server's address is set."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from cluster_network import TEST_API_SERVER_CIDR, configured_k8s
from k8s_render import K8S, find, kustomize, pods
from required_tools import kubectl

PLACEMENT = K8S / "overlays" / "gpu" / "gpu-nodes.yaml"


def _gpus(spec: dict) -> int:
    return sum(int(c["resources"].get("limits", {}).get("nvidia.com/gpu", 0)) for c in spec["containers"])


def _node_rule(spec: dict) -> tuple[str, str, tuple[str, ...]] | None:
    """(label key, operator, values) of the pod's one required node-affinity expression."""
    terms = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )
    if not terms:
        return None
    (term,) = terms
    (expression,) = term["matchExpressions"]
    return expression["key"], expression["operator"], tuple(expression["values"])


def assert_placed(manifests: list[dict], label: str, value: str, taint: str) -> None:
    placed = pods(manifests)
    gpu_pods = {where for where, spec in placed.items() if _gpus(spec)}
    assert gpu_pods == {"RayJob/slea-train/actors", "RayJob/slea-train/learner"}
    for where, spec in placed.items():
        tolerations = spec.get("tolerations", [])
        if where in gpu_pods:
            assert _node_rule(spec) == (label, "In", (value,)), f"{where} may land on a node without a GPU"
            assert {"key": taint, "operator": "Exists", "effect": "NoSchedule"} in tolerations, (
                f"{where}: taint not tolerated"
            )
        else:  # heads, library pods, the submitter, Redis
            assert _node_rule(spec) == (label, "NotIn", (value,)), f"{where} may take a GPU node's place"
            assert not tolerations, f"{where} tolerates a taint it has no use for"


def test_gpu_pods_on_gpu_nodes_and_every_other_pod_off_them(rendered):
    spec = yaml.safe_load(PLACEMENT.read_text())["spec"]
    assert_placed(rendered["gpu"], spec["label"], spec["value"], spec["taint"])


def test_the_placement_values_live_in_one_file(tmp_path):
    """Edit only gpu-nodes.yaml's three values: every pod follows, and no old value is left."""
    copied = configured_k8s(tmp_path)
    placement = copied / "overlays" / "gpu" / "gpu-nodes.yaml"
    text = placement.read_text()
    for old, new in (
        ("label: nvidia.com/gpu.present", "label: example.com/accelerator"),
        ('value: "true"', 'value: "h100"'),
        ("taint: nvidia.com/gpu ", "taint: example.com/dedicated "),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    placement.write_text(text)
    manifests = kustomize(copied / "overlays" / "gpu")
    assert_placed(manifests, "example.com/accelerator", "h100", "example.com/dedicated")
    assert "nvidia.com/gpu.present" not in yaml.safe_dump_all(manifests)
    assert not [doc for doc in manifests if doc["kind"] == "NodePlacement"], "local-config is not deployed"


def test_the_cpu_overlay_places_nothing(rendered):
    for where, spec in pods(rendered["cpu-kind"]).items():
        assert "affinity" not in spec and "tolerations" not in spec, f"{where}: kind has no GPU nodes"


@pytest.mark.parametrize("group", ["actors", "learner"])
def test_gpu_pods_give_rays_object_store_a_memory_backed_dev_shm(rendered, group):
    spec = pods(rendered["gpu"])[f"RayJob/slea-train/{group}"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (container,) = spec["containers"]
    (shm,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert volumes[shm]["emptyDir"] == {"medium": "Memory"}


def test_apply_stops_until_the_api_server_cidr_is_set(tmp_path):
    """A wrong API-server address fails nowhere: the autoscaler just cannot scale. So the overlay
    ships without one, and `kubectl apply -k` renders first and stops, naming the key, before it
    sends anything (no cluster is reachable here: an empty kubeconfig)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    result = subprocess.run(
        [kubectl(), "apply", "--dry-run=client", "-k", str(K8S / "overlays" / "gpu")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0, "the GPU overlay applies without an API-server address"
    assert "data.apiServerCIDR" in result.stderr and "slea-cluster" in result.stderr, result.stderr


def test_the_api_server_cidr_a_user_sets_is_the_only_one_the_autoscaler_reaches(rendered):
    policy = find(rendered["gpu"], "NetworkPolicy", "slea-head-kube-api")
    assert [peer["ipBlock"]["cidr"] for rule in policy["spec"]["egress"] for peer in rule["to"]] == [
        TEST_API_SERVER_CIDR
    ]
