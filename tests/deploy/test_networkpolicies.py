"""The shipped NetworkPolicies, evaluated: every flow the system needs is allowed and the ones a
security review forbids are denied. A small evaluator of Kubernetes NetworkPolicy semantics
(label selectors, namespace selectors, ports, the union of policies, ingress AND egress) runs over
the pods the overlays start plus the outside pods they talk to; no cluster needed. The test
proves the policies, not a CNI; it uses numbered ports only, as the shipped policies do."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from k8s_render import OVERLAYS
from test_pod_security import pods

NAMESPACE = "ml"


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicies see it."""

    name: str  # for messages
    namespace: str  # its namespace
    labels: dict = field(hash=False)  # its labels
    namespace_labels: dict = field(hash=False, default_factory=dict)  # labels of its namespace


def _matches(selector: dict | None, labels: dict) -> bool:
    if selector is None:
        return True
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict, pod: Pod) -> bool:
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], pod.namespace_labels):
            return False
    elif pod.namespace != NAMESPACE:  # a bare podSelector means the policy's own namespace
        return False
    return _matches(peer.get("podSelector"), pod.labels)


def _rule_allows(rule: dict, peers_key: str, peer: Pod, port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if ports and not any(p.get("port") == port and p.get("protocol", "TCP") == protocol for p in ports):
        return False
    peers = rule.get(peers_key)
    return not peers or any(_peer_matches(p, peer) for p in peers)


def allowed(policies: list[dict], source: Pod, destination: Pod, port: int, protocol: str = "TCP") -> bool:
    def side(pod: Pod, direction: str, peer: Pod, peers_key: str) -> bool:
        if pod.namespace != NAMESPACE:
            return True  # no policy of ours selects it
        selecting = [
            p
            for p in policies
            if direction in p["spec"].get("policyTypes", ["Ingress"]) and _matches(p["spec"]["podSelector"], pod.labels)
        ]
        if not selecting:
            return True
        return any(
            _rule_allows(rule, peers_key, peer, port, protocol)
            for p in selecting
            for rule in p["spec"].get(direction.lower(), [])
        )

    return side(destination, "Ingress", source, "from") and side(source, "Egress", destination, "to")


def _world(manifests: list[dict]) -> dict[str, Pod]:
    ns = {"kubernetes.io/metadata.name": NAMESPACE}
    world = {where: Pod(where, NAMESPACE, spec_labels, ns) for where, spec_labels in _pod_labels(manifests).items()}
    world.update(
        {
            "operator": Pod(
                "operator",
                "kuberay-system",
                {"app.kubernetes.io/name": "kuberay-operator"},
                {"kubernetes.io/metadata.name": "kuberay-system"},
            ),
            "prometheus": Pod(
                "prometheus",
                "monitoring",
                {"app.kubernetes.io/name": "prometheus"},
                {"kubernetes.io/metadata.name": "monitoring"},
            ),
            "dns": Pod("dns", "kube-system", {"k8s-app": "kube-dns"}, {"kubernetes.io/metadata.name": "kube-system"}),
            "client": Pod("client", NAMESPACE, {"slea.io/library-client": "true"}, ns),
            "stranger": Pod("stranger", NAMESPACE, {"app": "something-else"}, ns),
            "other-namespace": Pod("other-namespace", "team-b", {}, {"kubernetes.io/metadata.name": "team-b"}),
            "api-server": Pod("api-server", "default", {}, {"kubernetes.io/metadata.name": "default"}),
        }
    )
    return world


def _pod_labels(manifests: list[dict]) -> dict[str, dict]:
    labels = {}
    for doc in manifests:
        if doc["kind"] == "StatefulSet":
            labels[f"StatefulSet/{doc['metadata']['name']}"] = doc["spec"]["template"]["metadata"]["labels"]
    for where in pods(manifests):
        if not where.startswith("StatefulSet/"):
            kind, name, group = where.split("/")
            doc = next(d for d in manifests if d["kind"] == kind and d["metadata"]["name"] == name)
            if group == "submitter":
                labels[where] = doc["spec"]["submitterPodTemplate"]["metadata"]["labels"]
            else:
                from k8s_render import ray_cluster_specs, ray_pod_groups

                (cluster,) = ray_cluster_specs([doc]).values()
                labels[where] = ray_pod_groups(cluster)[group]["template"]["metadata"]["labels"]
    return labels


TRAIN, LIBRARY, REDIS = "RayJob/slea-train", "RayService/slea-library", "StatefulSet/slea-redis"
NEEDED = [  # (from, to, port): what the system does
    (f"{TRAIN}/actors", f"{TRAIN}/head", 6379),  # GCS
    (f"{TRAIN}/head", f"{TRAIN}/actors", 45000),  # raylet / worker RPCs on ephemeral ports
    (f"{TRAIN}/learner", f"{TRAIN}/actors", 29500),  # weight broadcast TCPStore / NCCL into the vLLM engines
    (f"{TRAIN}/actors", f"{TRAIN}/learner", 51234),
    (f"{TRAIN}/submitter", f"{TRAIN}/head", 8265),  # ray job submit
    (f"{TRAIN}/actors", f"{TRAIN}/library", 8000),
    (f"{LIBRARY}/library", f"{LIBRARY}/head", 6379),
    ("operator", f"{TRAIN}/head", 8265),
    ("operator", f"{LIBRARY}/head", 8265),
    ("operator", f"{LIBRARY}/head", 52365),
    ("prometheus", f"{TRAIN}/actors", 8080),
    ("prometheus", f"{LIBRARY}/head", 8080),
    ("prometheus", REDIS, 9121),
    (f"{TRAIN}/learner", REDIS, 6379),
    (f"{TRAIN}/actors", REDIS, 6379),
    (f"{TRAIN}/head", REDIS, 6379),
    (f"{LIBRARY}/library", REDIS, 6379),
    ("client", f"{LIBRARY}/library", 8000),
    ("client", f"{LIBRARY}/head", 8000),
    ("client", f"{TRAIN}/head", 8000),
    (f"{TRAIN}/head", "api-server", 443),  # the autoscaler
    (f"{TRAIN}/actors", "dns", 53),
]
FORBIDDEN = [  # (from, to, port): what a security review forbids
    ("stranger", f"{TRAIN}/head", 8265),
    ("stranger", f"{TRAIN}/head", 10001),
    ("other-namespace", f"{TRAIN}/head", 10001),
    ("operator", f"{TRAIN}/head", 10001),
    ("operator", f"{TRAIN}/head", 6379),
    (f"{LIBRARY}/library", f"{TRAIN}/head", 8265),
    (f"{LIBRARY}/head", f"{TRAIN}/head", 10001),  # across Ray clusters
    (f"{TRAIN}/actors", f"{LIBRARY}/head", 10001),
    ("stranger", REDIS, 6379),
    ("client", REDIS, 6379),
    ("prometheus", REDIS, 6379),
    ("prometheus", f"{TRAIN}/head", 8265),
    ("stranger", f"{TRAIN}/actors", 8080),
    ("stranger", f"{LIBRARY}/library", 8000),
    ("other-namespace", f"{LIBRARY}/library", 8000),
    (REDIS, f"{TRAIN}/head", 6379),
    (REDIS, "api-server", 443),
    (f"{TRAIN}/actors", "api-server", 443),
    (f"{TRAIN}/actors", "other-namespace", 8080),
    (f"{TRAIN}/submitter", REDIS, 6379),
]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_system_s_flows_are_allowed(rendered, overlay):
    policies = [doc for doc in rendered[overlay] if doc["kind"] == "NetworkPolicy"]
    world = _world(rendered[overlay])
    blocked = [
        (a, b, port)
        for a, b, port in NEEDED
        if not allowed(policies, world[a], world[b], port, "UDP" if port == 53 else "TCP")
    ]
    assert not blocked, f"needed flows the NetworkPolicies block: {blocked}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_else_is_denied(rendered, overlay):
    policies = [doc for doc in rendered[overlay] if doc["kind"] == "NetworkPolicy"]
    world = _world(rendered[overlay])
    open_flows = [(a, b, port) for a, b, port in FORBIDDEN if allowed(policies, world[a], world[b], port)]
    assert not open_flows, f"flows the NetworkPolicies must deny: {open_flows}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_default_deny_covers_every_slea_pod(rendered, overlay):
    (deny,) = [doc for doc in rendered[overlay] if doc["metadata"]["name"] == "slea-default-deny"]
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny["spec"]
    for where, labels in _pod_labels(rendered[overlay]).items():
        assert _matches(deny["spec"]["podSelector"], labels), f"{where} is not under the default deny"


def test_without_policies_everything_is_open(rendered):
    """The evaluator itself: no policy, no denial (so a FORBIDDEN flow passing above means the policies)."""
    world = _world(rendered["gpu"])
    assert all(allowed([], world[a], world[b], port) for a, b, port in FORBIDDEN)
