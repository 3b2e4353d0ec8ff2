"""What the KubeRay operator makes of a RayJob or a RayService before the kubelet sees a pod.

The deploy tests run these pods (tests/deploy/pod_sandbox.py), so every line here is taken from
KubeRay's own source at the commit whose CRDs the project validates against
(ray-project/kuberay feeaf72facab4881ba2b179248bb67315634e229, ../shared/schemas/kuberay/README.md),
under ray-operator/controllers/ray/:

- common/pod.go `BuildPod`, `generateRayStartCommand`, `setMissingRayStartParams`,
  `convertParamMap`: the container's `/bin/bash -c -- "ulimit -n ...; ray start ..."`;
- common/pod.go `setContainerEnvVars`, `SetContainerTokenAuthEnvVars`: the variables KubeRay adds;
- common/pod.go `initLivenessAndReadinessProbe`: the probes (Ray >= 2.53: one HTTP check);
- common/pod.go `DefaultWorkerPodTemplate`: the `wait-gcs-ready` init container of workers;
- common/pod.go `DefaultHeadPodTemplate`: `--no-monitor` on the head under in-tree autoscaling;
- common/pod.go `labelPod`, common/service.go `HeadServiceLabels`: labels and the head Service;
- common/job.go `BuildJobSubmitCommand` and rayjob_controller.go `configureSubmitterContainer`:
  the K8sJobMode submitter, whose `/bin/bash -ce` line holds the entrypoint.

Left out, because nothing here can run it: the autoscaler sidecar (it calls the Kubernetes API),
GCS fault tolerance, TLS, the history-server collector; the tests say where that matters.
"""

from __future__ import annotations

import copy
import json
import re

KUBERAY_COMMIT = "feeaf72facab4881ba2b179248bb67315634e229"
GCS_PORT = 6379  # utils.DefaultGcsServerPort (GetHeadPort: rayStartParams["port"] else this)
DASHBOARD_PORT = 8265  # utils.DefaultDashboardPort
DASHBOARD_AGENT_PORT = 52365  # utils.DefaultDashboardAgentListenPort: the node health endpoint
METRICS_PORT = 8080  # utils.DefaultMetricsPort
SERVE_PORT = 8000  # utils.DefaultServingPort
CLUSTER_DOMAIN = "cluster.local"  # utils.GetClusterDomainName's default


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ("250m", "2Gi", "3", "1e3") as a number."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"([0-9.eE+-]+)([a-zA-Z]*)", str(value))
    assert match and match.group(2) in {"", *units}, f"not a Kubernetes quantity: {value!r}"
    return float(match.group(1)) * units.get(match.group(2), 1)


def convert_param_map(params: dict[str, str]) -> str:
    """`convertParamMap`: sorted flags, " --key=value " each; "true" becomes a bare flag, "false"
    drops it (but for the few flags that take an explicit boolean)."""
    explicit_booleans = {"log-color", "include-dashboard", "include-log-monitor"}
    flags = ""
    for key in sorted(params):
        value = str(params[key])
        if value.lower() in {"true", "false"} and key not in explicit_booleans:
            flags += f" --{key} " if value.lower() == "true" else ""
        else:
            flags += f" --{key}={value} "
    return flags


def ray_start_command(head: bool, params: dict[str, str], resources: dict, head_fqdn: str, autoscaling: bool) -> str:
    """`setMissingRayStartParams` then `generateRayStartCommand` for one group."""
    params = dict(params)
    if head:
        params.setdefault("dashboard-host", "0.0.0.0")
        if autoscaling:
            params["no-monitor"] = "true"  # DefaultHeadPodTemplate: the sidecar autoscales instead
    else:
        params.setdefault("address", f"{head_fqdn}:{GCS_PORT}")
    params.setdefault("metrics-export-port", str(METRICS_PORT))
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", str(DASHBOARD_AGENT_PORT))
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    if "num-cpus" not in params and (cpu := limits.get("cpu", requests.get("cpu"))):
        params["num-cpus"] = str(_rounded_up(quantity(cpu)))  # resource.Quantity.Value() rounds up
    if "memory" not in params and "memory" in limits:
        params["memory"] = str(_rounded_up(quantity(limits["memory"])))
    if "num-gpus" not in params and "nvidia.com/gpu" in limits:  # addWellKnownAcceleratorResources
        params["num-gpus"] = str(_rounded_up(quantity(limits["nvidia.com/gpu"])))
    return ("ray start --head" if head else "ray start") + convert_param_map(params)


def _rounded_up(value: float) -> int:
    return int(-(-value // 1))


def head_service_name(cluster_name: str) -> str:
    """utils.GenerateHeadServiceName: the same pattern for a RayCluster and for the RayJob's or
    RayService's own Service (`<owner>-head-svc`)."""
    return f"{cluster_name}-head-svc"


def fqdn(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}"


def pod_labels(head: bool, cluster_name: str, group: str, template_labels: dict[str, str]) -> dict[str, str]:
    """`labelPod`: KubeRay's labels, the template's on top except the three it owns."""
    owned = {"ray.io/node-type", "ray.io/group", "ray.io/cluster"}
    labels = {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": cluster_name,
        "ray.io/node-type": "head" if head else "worker",
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster_name}-{'head' if head else 'worker'}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    labels.update({key: value for key, value in template_labels.items() if key not in owned})
    return labels


def head_service_selector(cluster_name: str) -> dict[str, str]:
    """common/service.go `HeadServiceLabels` (the two that pick the pod)."""
    return {"ray.io/cluster": cluster_name, "ray.io/node-type": "head"}


def _token_env(auth_options: dict | None) -> list[dict]:
    """`SetContainerTokenAuthEnvVars` with mode token and a secretName (not Kubernetes auth)."""
    if not auth_options or auth_options.get("mode") != "token":
        return []
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {
            "name": "RAY_AUTH_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": auth_options["secretName"], "key": "auth_token"}},
        },
    ]


def _add_env(container: dict, variables: list[dict]) -> None:
    """Append each variable the container does not set already (`EnvVarExists` checks)."""
    env = container.setdefault("env", [])
    for variable in variables:
        if not any(existing["name"] == variable["name"] for existing in env):
            env.append(variable)


def _add_empty_dir(spec: dict, container: dict, name: str, mount_path: str, medium: str = "") -> None:
    """`addEmptyDir`: only where nothing is mounted at that path yet."""
    if any(mount["mountPath"] == mount_path for mount in container.get("volumeMounts", [])):
        return
    spec.setdefault("volumes", []).append({"name": name, "emptyDir": {"medium": medium} if medium else {}})
    container.setdefault("volumeMounts", []).append({"name": name, "mountPath": mount_path})


def _probes(container: dict, head: bool, serve_worker: bool, agent_port: int) -> None:
    """`initLivenessAndReadinessProbe` for Ray >= 2.53 (supportsUnifiedHealthCheck): httpGet
    /api/healthz on the dashboard agent; a RayService worker's readiness adds Serve's proxy."""
    timeout = 5 if head else 2  # Default(Head)LivenessProbeTimeoutSeconds / ReadinessProbe
    health = {"path": "/api/healthz", "port": agent_port}
    container.setdefault(
        "livenessProbe",
        {
            "httpGet": health,
            "initialDelaySeconds": 30,
            "timeoutSeconds": timeout,
            "periodSeconds": 5,
            "successThreshold": 1,
            "failureThreshold": 120,
        },
    )
    if "readinessProbe" in container:
        return
    readiness = {
        "httpGet": health,
        "initialDelaySeconds": 10,
        "timeoutSeconds": timeout,
        "periodSeconds": 5,
        "successThreshold": 1,
        "failureThreshold": 10,
    }
    if serve_worker:  # utils.BaseWgetHealthCommand, RayAgentRayletHealthPath, RayServeProxyHealthPath
        readiness.pop("httpGet")
        checks = [
            f"wget --tries 1 -T 2 -q -O- http://localhost:{agent_port}/api/local_raylet_healthz | grep success",
            f"wget --tries 1 -T 10 -q -O- http://localhost:{SERVE_PORT}/-/healthz | grep success",
        ]
        readiness.update(exec={"command": ["bash", "-c", " && ".join(checks)]}, failureThreshold=1)
    container["readinessProbe"] = readiness


def ray_pod(
    cluster_spec: dict,
    group: str,
    cluster_name: str,
    pod_name: str,
    namespace: str,
    creator: str,
) -> dict:
    """The Pod KubeRay creates for `group` ("head" or a worker group's name) of a RayCluster spec
    (a RayJob's rayClusterSpec or a RayService's rayClusterConfig); `creator` is "RayJob" or
    "RayService"."""
    head = group == "head"
    group_spec = (
        cluster_spec["headGroupSpec"]
        if head
        else next(spec for spec in cluster_spec["workerGroupSpecs"] if spec["groupName"] == group)
    )
    template = copy.deepcopy(group_spec["template"])
    spec = template["spec"]
    container = spec["containers"][0]
    head_fqdn = fqdn(head_service_name(cluster_name), namespace)
    autoscaling = bool(cluster_spec.get("enableInTreeAutoscaling"))
    start = ray_start_command(
        head, group_spec.get("rayStartParams", {}), container.get("resources", {}), head_fqdn, autoscaling
    )
    _add_empty_dir(spec, container, "shared-mem", "/dev/shm", "Memory")
    if head and autoscaling:
        _add_empty_dir(spec, container, "ray-logs", "/tmp/ray")
    given = " ".join(container.get("command", []) + container.get("args", []))
    if "ray start" not in given:
        generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}"
        container["command"] = ["/bin/bash", "-c", "--"]
        container["args"] = [f"{given} && {generated}" if given else generated]
    token = _token_env(cluster_spec.get("authOptions"))
    _add_env(container, token)
    address = "127.0.0.1" if head else head_fqdn
    kuberay_env = (
        []
        if head
        else [{"name": "FQ_RAY_IP", "value": head_fqdn}, {"name": "RAY_IP", "value": head_fqdn.split(".")[0]}]
    )
    kuberay_env += [
        {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}},
        {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "RAY_CLOUD_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "RAY_NODE_TYPE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}}},
        {"name": "KUBERAY_GEN_RAY_START_CMD", "value": start},
        {"name": "RAY_PORT", "value": str(GCS_PORT)},
    ]
    if creator == "RayService":
        kuberay_env += [
            {"name": "RAY_TIMEOUT_MS_TASK_WAIT_FOR_DEATH_INFO", "value": "0"},
            {"name": "RAY_GCS_SERVER_REQUEST_TIMEOUT_SECONDS", "value": "5"},
            {"name": "RAY_SERVE_KV_TIMEOUT_S", "value": "5"},
        ]
    kuberay_env += [
        {"name": "RAY_ADDRESS", "value": f"{address}:{GCS_PORT}"},
        {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"},
        {"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "value": "1"},
    ]
    _add_env(container, kuberay_env)
    if not head:
        wait = (
            "SECONDS=0\nwhile true; do\n"
            f"  if ray health-check --address {head_fqdn}:{GCS_PORT} > /dev/null 2>&1; then echo 'GCS is ready.'; break; fi\n"
            '  echo "$SECONDS seconds elapsed: Waiting for GCS to be ready."\n  sleep 5\ndone\n'
        )
        init = {
            "name": "wait-gcs-ready",
            "image": container["image"],
            "command": ["/bin/bash", "-c", "--"],
            "args": [wait],
            "securityContext": copy.deepcopy(container.get("securityContext", {})),
            "env": copy.deepcopy(container["env"]),
            "volumeMounts": copy.deepcopy(container.get("volumeMounts", [])),
        }
        _add_env(
            init, [{"name": "FQ_RAY_IP", "value": head_fqdn}, {"name": "RAY_IP", "value": head_fqdn.split(".")[0]}]
        )
        spec["initContainers"] = [*spec.get("initContainers", []), init]
    agent_port = int(group_spec.get("rayStartParams", {}).get("dashboard-agent-listen-port", DASHBOARD_AGENT_PORT))
    _probes(container, head, serve_worker=creator == "RayService" and not head, agent_port=agent_port)
    labels = pod_labels(
        head, cluster_name, "headgroup" if head else group, template.get("metadata", {}).get("labels", {})
    )
    if creator == "RayService":  # BuildPod: workers serve at once; the head's label is the controller's
        labels["ray.io/serve"] = "false" if head else "true"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def job_submit_command(rayjob: dict, dashboard_url: str, job_id: str) -> str:
    """`BuildJobSubmitCommand` in K8sJobMode, joined with spaces as `configureSubmitterContainer`
    does: the one string the submitter's `/bin/bash -ce` runs. The entrypoint goes in as it is,
    so that bash expands whatever the entrypoint leaves unquoted, in the submitter's environment."""
    address = dashboard_url if dashboard_url.startswith("http://") else f"http://{dashboard_url}"
    health = (
        'python -c "import urllib.request; r=urllib.request.urlopen('
        f"'{address}/api/gcs_healthz', timeout=10); exit(0 if b'success' in r.read() else 1)\""
    )
    spec = rayjob["spec"]
    command = [
        "until",
        health,
        ">/dev/null",
        "2>&1",
        ";",
        "do",
        "echo",
        json.dumps(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."),
        ";",
        "sleep",
        "2",
        ";",
        "done",
        ";",
    ]
    command += ["if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";", "then"]
    command += ["ray", "job", "submit", "--address", address, "--no-wait"]
    if runtime_env := spec.get("runtimeEnvYAML"):
        import yaml

        command += ["--runtime-env-json", json.dumps(json.dumps(yaml.safe_load(runtime_env), separators=(",", ":")))]
    if metadata := spec.get("metadata"):
        command += ["--metadata-json", json.dumps(json.dumps(metadata, separators=(",", ":")))]
    command += ["--submission-id", job_id]
    for key, flag in (("entrypointNumCpus", "--entrypoint-num-cpus"), ("entrypointNumGpus", "--entrypoint-num-gpus")):
        if spec.get(key, 0) > 0:
            command += [flag, f"{float(spec[key]):f}"]
    if resources := spec.get("entrypointResources"):
        command += ["--entrypoint-resources", json.dumps(resources)]
    command += ["--", spec["entrypoint"].strip(), ";", "fi", ";"]
    command += ["ray", "job", "logs", "--address", address, "--follow", job_id]
    return " ".join(command)


def submitter_pod(rayjob: dict, cluster_name: str, job_id: str, pod_name: str, namespace: str) -> dict:
    """The K8sJobMode submitter: `getSubmitterTemplate` + `configureSubmitterContainer`."""
    template = copy.deepcopy(rayjob["spec"]["submitterPodTemplate"])
    spec = template["spec"]
    container = spec["containers"][0]
    dashboard_url = f"{fqdn(head_service_name(cluster_name), namespace)}:{DASHBOARD_PORT}"
    if not container.get("command"):
        container["command"] = ["/bin/bash", "-ce", "--"]
        container["args"] = [job_submit_command(rayjob, dashboard_url, job_id)]
    container.setdefault("env", []).extend(
        [
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "RAY_DASHBOARD_ADDRESS", "value": dashboard_url},
            {"name": "RAY_JOB_SUBMISSION_ID", "value": job_id},
        ]
    )
    _add_env(container, _token_env(rayjob["spec"]["rayClusterSpec"].get("authOptions")))
    labels = dict(template.get("metadata", {}).get("labels", {}))
    labels.update(
        {
            "ray.io/originated-from-cr-name": rayjob["metadata"]["name"],
            "ray.io/originated-from-crd": "RayJob",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }
