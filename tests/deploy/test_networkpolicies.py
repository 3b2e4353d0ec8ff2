"""The shipped NetworkPolicies, evaluated: every flow the system needs is allowed and the ones a
security review forbids are denied. A small evaluator of Kubernetes NetworkPolicy semantics
(label selectors, namespace selectors, ports, the union of policies, ingress AND egress) runs over
the pods the overlays start plus the outside pods and addresses they talk to; no cluster needed.
The test proves the policies, not a CNI. A peer or port form the evaluator does not model (named
ports, endPort, an ipBlock with except) raises instead of being read as something else."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import pytest
import yaml
from cluster_network import TEST_API_SERVER_CIDR
from k8s_render import K8S, OVERLAYS
from test_pod_security import pods

NAMESPACE = "ml"


@dataclass(frozen=True)
class Pod:
    """A pod as NetworkPolicies see it."""

    name: str  # for messages
    namespace: str  # its namespace
    labels: dict = field(hash=False)  # its labels
    namespace_labels: dict = field(hash=False, default_factory=dict)  # labels of its namespace
    ip: str | None = None  # an address outside the pod network (the API server, the internet): ipBlock peers


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


class Unmodelled(ValueError):
    """A NetworkPolicy form this evaluator does not model: reading it as another would prove nothing."""


PEER_KEYS = {"podSelector", "namespaceSelector", "ipBlock"}
PORT_KEYS = {"port", "protocol"}


def _peer_matches(peer: dict, pod: Pod) -> bool:
    if set(peer) - PEER_KEYS:
        raise Unmodelled(f"peer keys {sorted(set(peer) - PEER_KEYS)}")
    if "ipBlock" in peer:
        if set(peer) != {"ipBlock"} or set(peer["ipBlock"]) != {"cidr"}:
            raise Unmodelled(f"ipBlock with {peer} (only a lone ipBlock with a cidr is modelled)")
        # ipBlock is for addresses outside the cluster's pods; pods (ip None) never match it here
        return pod.ip is not None and ipaddress.ip_address(pod.ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if pod.ip is not None:  # an outside address: selectors select pods only
        return False
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], pod.namespace_labels):
            return False
    elif pod.namespace != NAMESPACE:  # a bare podSelector means the policy's own namespace
        return False
    return _matches(peer.get("podSelector"), pod.labels)


def _port_matches(rule_port: dict, port: int, protocol: str) -> bool:
    if set(rule_port) - PORT_KEYS or not isinstance(rule_port.get("port"), int):
        raise Unmodelled(f"port {rule_port} (only a numbered port with its protocol is modelled)")
    return rule_port["port"] == port and rule_port.get("protocol", "TCP") == protocol


def _rule_allows(rule: dict, peers_key: str, peer: Pod, port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    if ports and not any(_port_matches(p, port, protocol) for p in ports):
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


def api_server_address(overlay: str) -> str:
    """An address inside the overlay's apiServerCIDR (cluster-network.yaml): where its API server is.
    The GPU overlay ships it unset; the `rendered` fixture sets TEST_API_SERVER_CIDR, as a user would."""
    if overlay == "gpu":
        cidr = TEST_API_SERVER_CIDR
    else:
        cluster_network = yaml.safe_load((K8S / "overlays" / overlay / "cluster-network.yaml").read_text())
        cidr = cluster_network["data"]["apiServerCIDR"]
    network = ipaddress.ip_network(cidr)
    return str(next(iter(network.hosts()), network.network_address))


def _world(manifests: list[dict], overlay: str = "gpu") -> dict[str, Pod]:
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
            "operator-lookalike": Pod(  # the operator's label on a pod in another namespace
                "operator-lookalike",
                "team-b",
                {"app.kubernetes.io/name": "kuberay-operator"},
                {"kubernetes.io/metadata.name": "team-b"},
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
            "api-server": Pod("api-server", "", {}, {}, ip=api_server_address(overlay)),
            "internet": Pod("internet", "", {}, {}, ip="93.184.216.34"),
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
    (f"{TRAIN}/head", "internet", 443),  # the autoscaler's egress is the API server's, not any address on 443
    (f"{LIBRARY}/head", "internet", 6443),
    ("operator-lookalike", f"{TRAIN}/head", 8265),
    ("operator-lookalike", f"{LIBRARY}/head", 52365),
]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_system_s_flows_are_allowed(rendered, overlay):
    policies = [doc for doc in rendered[overlay] if doc["kind"] == "NetworkPolicy"]
    world = _world(rendered[overlay], overlay)
    blocked = [
        (a, b, port)
        for a, b, port in NEEDED
        if not allowed(policies, world[a], world[b], port, "UDP" if port == 53 else "TCP")
    ]
    assert not blocked, f"needed flows the NetworkPolicies block: {blocked}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_else_is_denied(rendered, overlay):
    policies = [doc for doc in rendered[overlay] if doc["kind"] == "NetworkPolicy"]
    world = _world(rendered[overlay], overlay)
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


@pytest.mark.parametrize(
    "form",
    [
        {"ports": [{"protocol": "TCP", "port": "serve"}]},  # a named port
        {"ports": [{"protocol": "TCP", "port": 8000, "endPort": 8010}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]},
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]},
        {"to": [{"serviceSelector": {}}]},
    ],
)
def test_the_evaluator_refuses_a_form_it_does_not_model(rendered, form):
    policy = {"spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [form]}}
    world = _world(rendered["gpu"])
    with pytest.raises(Unmodelled):
        allowed([policy], world[f"{TRAIN}/head"], world["internet"], 8000)


def test_the_base_s_api_server_placeholder_never_reaches_a_cluster(rendered):
    for overlay, manifests in rendered.items():
        (policy,) = [doc for doc in manifests if doc["metadata"]["name"] == "slea-head-kube-api"]
        cidr = policy["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"]
        ipaddress.ip_network(cidr)  # a real CIDR, not the base's API_SERVER_CIDR
        assert ipaddress.ip_address(api_server_address(overlay)) in ipaddress.ip_network(cidr), overlay
