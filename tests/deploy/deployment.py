"""The cpu-kind overlay deployed on this machine: its manifests rendered with `kubectl kustomize`,
the Secrets made the way deploy/README.md tells a user to, and each workload turned into the pods
its controller would create (the StatefulSet's pod, KubeRay's Ray pods and submitter), run by the
pod sandbox (tests/deploy/pod_sandbox.py). The deploy tests drive a deployment through this.
"""

from __future__ import annotations

import copy
import json
import secrets
import string
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import kuberay_pods
import yaml
from image_layout import redis_exporter_image, redis_image, slea_image
from k8s_render import K8S, find, kustomize
from pod_sandbox import NO_PROXY, Node, Pod

OVERLAY = K8S / "overlays" / "cpu-kind"
NAMESPACE = "default"


def random_suffix(length: int = 5) -> str:
    """KubeRay's and the ReplicaSet's `rand.String(5)`: lower-case letters and digits."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))


@dataclass
class Attempt:
    """One attempt of the RayJob: a RayCluster of its own and a submitter (KubeRay makes a new one
    of each, with a new cluster name and job id, on every retry)."""

    cluster_name: str
    job_id: str
    head: str = ""
    workers: dict[str, list[str]] = field(default_factory=dict)  # group -> pod names
    submitter: str = ""


class Deployment:
    """The rendered cpu-kind overlay, run on one Node."""

    def __init__(self, root: Path, baked: dict[str, Path]) -> None:
        self.manifests = kustomize(OVERLAY)
        images = {
            "slea-rl": slea_image(baked),
            "redis": redis_image(),
            "oliver006/redis_exporter": redis_exporter_image(),
        }
        self.node = Node(root, images, NAMESPACE)
        self.redis_password = secrets.token_hex(24)  # deploy/README.md: openssl rand -hex 24
        self.node.secrets["slea-redis"] = {
            "password": self.redis_password.encode(),
            "exporter-password": secrets.token_hex(24).encode(),
        }
        self.node.secrets["slea-ray-token"] = {"auth_token": secrets.token_hex(32).encode()}
        for config_map in (doc for doc in self.manifests if doc["kind"] == "ConfigMap"):
            self.node.config_maps[config_map["metadata"]["name"]] = config_map.get("data", {})
        for service in (doc for doc in self.manifests if doc["kind"] == "Service"):
            self.node.add_service(service["metadata"]["name"], service["spec"]["selector"])

    @property
    def ray_token(self) -> str:
        return self.node.secrets["slea-ray-token"]["auth_token"].decode()

    # --- Redis: the StatefulSet's one pod --------------------------------------------------------
    def start_redis(self, timeout_s: float = 120) -> Pod:
        """slea-redis-0 with its claim data-slea-redis-0 (volumeClaimTemplates): the same claim for
        every pod of that name, as a StatefulSet keeps it."""
        statefulset = find(self.manifests, "StatefulSet", "slea-redis")
        template = copy.deepcopy(statefulset["spec"]["template"])
        name = f"{statefulset['metadata']['name']}-0"
        for claim in statefulset["spec"].get("volumeClaimTemplates", []):
            claim_name = f"{claim['metadata']['name']}-{name}"
            template["spec"].setdefault("volumes", []).append(
                {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}}
            )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, **template["metadata"]},
            "spec": template["spec"],
        }
        pod["metadata"]["name"] = name
        self.node.start(pod)
        return self.node.wait_ready(name, timeout_s)

    # --- the RayJob ----------------------------------------------------------------------------
    def rayjob(self, run_label: str, extra_settings: list[str]) -> dict:
        """The rendered RayJob with the pods' run label set (what a user's overlay does for a new
        run) and `extra_settings` appended to the entrypoint as `--set` pairs (sizes for this
        machine: they come after the overlay's, so they win)."""
        rayjob = copy.deepcopy(find(self.manifests, "RayJob", "slea-train"))
        cluster = rayjob["spec"]["rayClusterSpec"]
        templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
        for template in [*templates, rayjob["spec"]["submitterPodTemplate"]]:
            template["metadata"]["labels"]["slea.io/run"] = run_label
        rayjob["spec"]["entrypoint"] += "".join(f" --set {setting}" for setting in extra_settings)
        return rayjob

    def start_attempt(self, rayjob: dict, workers: dict[str, int], timeout_s: float = 300) -> Attempt:
        """What the RayJob controller does for one attempt: a RayCluster (head, then the workers,
        whose init containers wait for the GCS), its head Services, and once the cluster is ready,
        the submitter Job's pod."""
        name = rayjob["metadata"]["name"]
        attempt = Attempt(cluster_name=f"{name}-{random_suffix()}", job_id=f"{name}-{random_suffix()}")
        cluster_spec = rayjob["spec"]["rayClusterSpec"]
        selector = kuberay_pods.head_service_selector(attempt.cluster_name)
        self.node.add_service(kuberay_pods.head_service_name(attempt.cluster_name), selector)
        self.node.add_service(kuberay_pods.head_service_name(name), selector)  # the RayJob's own, moved to this cluster
        attempt.head = f"{attempt.cluster_name}-head-{random_suffix()}"
        self.node.start(
            kuberay_pods.ray_pod(cluster_spec, "head", attempt.cluster_name, attempt.head, NAMESPACE, "RayJob")
        )
        self.node.wait_ready(attempt.head, timeout_s)
        self._start_workers(cluster_spec, attempt, workers, "RayJob", timeout_s)
        attempt.submitter = f"{name}-{random_suffix()}"  # the Job's pod
        self.node.start(
            kuberay_pods.submitter_pod(rayjob, attempt.cluster_name, attempt.job_id, attempt.submitter, NAMESPACE)
        )
        return attempt

    def _start_workers(
        self,
        cluster_spec: dict,
        attempt: Attempt,
        workers: dict[str, int],
        creator: str,
        timeout_s: float,
        ready: bool = True,
    ) -> None:
        """One worker pod after another, each ready before the next: KubeRay creates them at once,
        but on 2 cores a raylet whose dashboard agent starts late beside three others gives up
        ("Timed out waiting for file dashboard_agent_listen_port"), which no cluster here shows.
        With `ready` False each waits only for its raylet's agent (a RayService worker is ready
        only once Serve's proxy answers, which is after the serve config goes in)."""
        for group, count in workers.items():
            for _ in range(count):
                pod = f"{attempt.cluster_name}-{group}-worker-{random_suffix()}"
                attempt.workers.setdefault(group, []).append(pod)
                self.node.start(
                    kuberay_pods.ray_pod(cluster_spec, group, attempt.cluster_name, pod, NAMESPACE, creator)
                )
                if ready:
                    self.node.wait_ready(pod, timeout_s)
                else:
                    self.node.wait_probe(pod, "/api/healthz", kuberay_pods.DASHBOARD_AGENT_PORT, timeout_s)

    def pods_of(self, attempt: Attempt) -> list[str]:
        """The attempt's pods: the submitter, the head, the workers."""
        return [attempt.submitter, attempt.head, *(p for pods in attempt.workers.values() for p in pods)]

    def lose_attempt(self, attempt: Attempt) -> None:
        """Every pod of the attempt lost at once (SIGKILL: its node died), as before KubeRay's
        retry deletes what is left of the RayCluster."""
        for pod in self.pods_of(attempt):
            if pod in self.node.pods:
                self.node.kill(pod)

    # --- the RayService ------------------------------------------------------------------------
    def start_rayservice(self, workers: int = 1, timeout_s: float = 300) -> Attempt:
        """The RayService's RayCluster, and its serveConfigV2 deployed the way the RayService
        controller deploys it: PUT to the head's dashboard at /api/serve/applications/ with the
        cluster's token (rayservice_controller.go updateServeDeployment, through the dashboard
        client, dashboard_httpclient.go UpdateDeployments)."""
        service = find(self.manifests, "RayService", "slea-library")
        name = service["metadata"]["name"]
        attempt = Attempt(cluster_name=f"{name}-{random_suffix()}", job_id="")
        cluster_spec = service["spec"]["rayClusterConfig"]
        self.node.add_service(
            kuberay_pods.head_service_name(attempt.cluster_name),
            kuberay_pods.head_service_selector(attempt.cluster_name),
        )
        self.node.add_service(f"{name}-serve-svc", {"ray.io/cluster": attempt.cluster_name, "ray.io/serve": "true"})
        attempt.head = f"{attempt.cluster_name}-head-{random_suffix()}"
        self.node.start(
            kuberay_pods.ray_pod(cluster_spec, "head", attempt.cluster_name, attempt.head, NAMESPACE, "RayService")
        )
        head = self.node.wait_ready(attempt.head, timeout_s)
        group = cluster_spec["workerGroupSpecs"][0]["groupName"]
        self._start_workers(cluster_spec, attempt, {group: workers}, "RayService", timeout_s, ready=False)
        request = urllib.request.Request(
            f"http://{head.ip}:{kuberay_pods.DASHBOARD_PORT}/api/serve/applications/",
            data=json.dumps(yaml.safe_load(service["spec"]["serveConfigV2"])).encode(),
            method="PUT",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.ray_token}"},
        )
        with NO_PROXY.open(request, timeout=60) as response:
            assert response.status == 200, f"the dashboard refused the serve config: {response.status}"
        for pod in attempt.workers[group]:
            self.node.wait_ready(pod, timeout_s)
        return attempt

    def close(self) -> None:
        self.node.close()
