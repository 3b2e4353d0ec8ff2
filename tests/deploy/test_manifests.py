"""The Kustomize overlays render, validate against the real schemas, and agree with the run
config, the monitoring setup and the images: names, labels, ports, env vars, pools, sizes."""

from __future__ import annotations

import copy
import re
import shutil
from importlib.metadata import version
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_render import (
    K8S,
    OVERLAYS,
    REPO,
    custom_resources,
    entrypoint_config,
    find,
    kustomize,
    ray_cluster_specs,
    ray_pod_groups,
)
from packaging.version import Version

from slea.channels import LIBRARY_APP
from slea.config import load_config

POOLS = {"actors": "actor_pool", "learner": "learner_pool", "library": "library_pool"}
CORE_KINDS = {"ConfigMap", "NetworkPolicy", "PersistentVolumeClaim", "Service", "StatefulSet"}
RAY_KINDS = {"RayJob", "RayService"}


def strict(schema: dict) -> dict:
    """The CRD schema with unknown fields rejected, as the API server's strict field validation
    does (structural schemas prune them silently otherwise, hiding typos like `minReplica`)."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for child in node.values():
                close(child)
        elif isinstance(node, list):
            for child in node:
                close(child)

    close(schema)
    return schema


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_keep_the_head_and_the_learner_through_a_drain_and_let_redis_move(rendered, overlay):
    """The head and the learner go with their run, so a drain may wait for them; Redis outlives every
    run, so a budget of 0 would block its node's drains for ever: it may move (one pod at a time),
    a reschedule the components wait out (test_run_state.py, the reconnect window)."""
    budgets = {
        doc["metadata"]["name"]: doc["spec"] for doc in rendered[overlay] if doc["kind"] == "PodDisruptionBudget"
    }
    kept = {}
    for name, spec in budgets.items():
        if name == "slea-redis":
            assert spec.get("maxUnavailable") == 1 and "minAvailable" not in spec, (
                f"{name}: {spec} blocks every drain of Redis's node"
            )
        else:
            assert spec["maxUnavailable"] == 0, f"{name}: a voluntary eviction must wait for the run"
        selector = spec["selector"]["matchLabels"]
        chosen = [
            (doc["kind"], labels.get("slea.io/component") or labels["app.kubernetes.io/name"])
            for doc, labels in _pod_labels(rendered[overlay])
            if all(labels.get(key) == value for key, value in selector.items())
        ]
        assert chosen, f"{name} selects no pod of the deployment"
        kept[name] = chosen
    assert kept == {
        "slea-train-head": [("RayJob", "head")],
        "slea-train-learner": [("RayJob", "learner")],
        "slea-redis": [("StatefulSet", "slea-redis")],
    }


def _pod_labels(manifests: list[dict]):
    """(document, pod labels) of every pod template: Ray groups and the Redis StatefulSet."""
    for doc in manifests:
        if doc["kind"] == "StatefulSet":
            yield doc, doc["spec"]["template"]["metadata"]["labels"]
        elif doc["kind"] in ("RayJob", "RayService"):
            for cluster in ray_cluster_specs([doc]).values():
                for group in ray_pod_groups(cluster).values():
                    yield doc, group["template"]["metadata"]["labels"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_deployment(rendered, overlay):
    kinds = sorted((doc["kind"], re.sub(r"-[a-z0-9]{10}$", "", doc["metadata"]["name"])) for doc in rendered[overlay])
    assert [k for k in kinds if k[0] != "NetworkPolicy"] == [
        ("ConfigMap", "slea-redis-config"),
        ("PersistentVolumeClaim", "slea-runs"),
        ("PodDisruptionBudget", "slea-redis"),
        ("PodDisruptionBudget", "slea-train-head"),
        ("PodDisruptionBudget", "slea-train-learner"),
        ("RayJob", "slea-train"),
        ("RayService", "slea-library"),
        ("Service", "slea-redis"),
        ("StatefulSet", "slea-redis"),
    ]
    assert ("NetworkPolicy", "slea-default-deny") in kinds
    assert all(doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "slea-rl" for doc in rendered[overlay])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_kinds_validate_against_the_kuberay_crds(rendered, kuberay_schemas, overlay):
    for doc in rendered[overlay]:
        if doc["kind"] in RAY_KINDS:
            assert doc["apiVersion"] == "ray.io/v1"
            jsonschema.validate(doc, strict(kuberay_schemas[doc["kind"]]))


def test_strict_crd_validation_catches_a_typo(rendered, kuberay_schemas):
    rayjob = copy.deepcopy(find(rendered["gpu"], "RayJob"))
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplica"] = 1
    with pytest.raises(jsonschema.ValidationError, match="minReplica"):
        jsonschema.validate(rayjob, strict(kuberay_schemas["RayJob"]))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_kinds_validate(rendered, overlay):
    for doc in rendered[overlay]:
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_entrypoint_config_validates_and_joins_the_cluster(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    assert config.ray.address == "auto"
    redis = find(rendered[overlay], "Service", "slea-redis")
    url = urlparse(config.redis.url)
    assert (url.hostname, url.port) == (redis["metadata"]["name"], redis["spec"]["ports"][0]["port"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_component_is_pinned_to_its_own_pool(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    asks = {"actors": config.actors.resources, "learner": config.learner.resources, "library": config.library.resources}
    for where, cluster in ray_cluster_specs(rendered[overlay]).items():
        groups = ray_pod_groups(cluster)
        assert groups["head"]["rayStartParams"]["num-cpus"] == "0", f"{where}: the head must not run components"
        for name, group in groups.items():
            offered = custom_resources(group)
            for component, pool in POOLS.items():
                assert (pool in offered) == (name == component), f"{where} group {name} and {pool}"
            if name in asks:
                assert set(asks[name]) == {POOLS[name]} and asks[name][POOLS[name]] <= offered[POOLS[name]]
        assert cluster["enableInTreeAutoscaling"] is True
    # the Serve replicas of the library app sit on the library pool as well
    serve = yaml.safe_load(find(rendered[overlay], "RayService")["spec"]["serveConfigV2"])
    options = serve["applications"][0]["deployments"][0]["ray_actor_options"]
    assert options["resources"] == config.library.resources


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_actor_pool_sizes_come_from_actor_pool_yaml(rendered, overlay):
    """The run starts `workers` actor workers on as many pods; `slea scale` may grow the pool up
    to `maxWorkers` pods (the autoscaler's ceiling) and shrink it to nothing but its own minimum."""
    config, overrides = entrypoint_config(find(rendered[overlay], "RayJob"))
    pool = yaml.safe_load((K8S / "overlays" / overlay / "actor-pool.yaml").read_text())
    workers, max_workers = int(pool["data"]["workers"]), int(pool["data"]["maxWorkers"])
    actors = ray_pod_groups(find(rendered[overlay], "RayJob")["spec"]["rayClusterSpec"])["actors"]
    assert config.actors.num_workers == actors["replicas"] == workers
    assert actors["maxReplicas"] == max_workers > workers, "no room to scale the actor pool up"
    assert actors["minReplicas"] == 0, "the autoscaler must be free to remove every actor pod the pool stops using"
    assert overrides[-1] == f"actors.num_workers={workers}"
    assert "slea-actor-pool" not in {doc["metadata"]["name"] for doc in rendered[overlay]}, (
        "local-config is not deployed"
    )


def test_changing_the_pool_sizes_changes_everything(tmp_path):
    copied = tmp_path / "k8s"
    shutil.copytree(K8S, copied)
    pool_file = copied / "overlays" / "cpu-kind" / "actor-pool.yaml"
    text = re.sub(r'workers: "\d+"', 'workers: "5"', pool_file.read_text())
    pool_file.write_text(re.sub(r'maxWorkers: "\d+"', 'maxWorkers: "9"', text))
    manifests = kustomize(copied / "overlays" / "cpu-kind")
    config, _ = entrypoint_config(find(manifests, "RayJob"))
    actors = ray_pod_groups(find(manifests, "RayJob")["spec"]["rayClusterSpec"])["actors"]
    assert config.actors.num_workers == actors["replicas"] == 5 and actors["maxReplicas"] == 9


def _gpus(group: dict) -> int:
    limits = group["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    return int(limits.get("nvidia.com/gpu", 0))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpus_and_engine_match_the_config(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    groups = ray_pod_groups(find(rendered[overlay], "RayJob")["spec"]["rayClusterSpec"])
    assert _gpus(groups["actors"]) >= config.actors.num_gpus and _gpus(groups["learner"]) >= config.learner.num_gpus
    if overlay == "gpu":
        assert config.actors.engine == "vllm" and config.actors.dtype == "auto" and config.learner.zero_stage == 2
        assert _gpus(groups["actors"]) == _gpus(groups["learner"]) == 1
    else:
        assert config.actors.engine == "transformers" and config.model.name == "smollm2-135m-instruct"
        assert not config.actors.engine_args, "vLLM engine arguments would reach the transformers engine"
        images = {c["image"] for doc in rendered[overlay] for c in _containers(doc) if c["name"].startswith("ray-")}
        assert len(images) == 1 and images.pop().startswith("slea-rl:cpu-"), "the kind overlay runs a CPU image build"
        assert all(_gpus(group) == 0 for group in groups.values())


def _containers(doc: dict) -> list[dict]:
    if doc["kind"] == "StatefulSet":
        return doc["spec"]["template"]["spec"]["containers"]
    if doc["kind"] in RAY_KINDS:
        return [
            c
            for group in ray_pod_groups(next(iter(ray_cluster_specs([doc]).values()))).values()
            for c in group["template"]["spec"]["containers"]
        ]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_passwords_come_from_secret_files_never_env_or_arguments(rendered, overlay):
    """The Secret slea-redis reaches pods only as mounted files: the Ray pods get its `password` key
    where the config reads it (redis.password_file), the Redis pod builds its ACL from it."""
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    assert config.redis.password_env is None and config.redis.username == "slea"
    password_dir, password_name = config.redis.password_file.rsplit("/", 1)
    for doc in rendered[overlay]:
        if doc["kind"] not in RAY_KINDS | {"StatefulSet"}:
            continue
        for template in _pod_templates(doc):
            spec = template["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                # only the pod's own fields (its labels: SLEA_RUN_ID) may come from elsewhere
                assert not [e for e in container.get("env", []) if set(e.get("valueFrom", {})) - {"fieldRef"}], (
                    f"{container['name']}: secret in env"
                )
                assert not [a for a in container.get("args", []) + container.get("command", []) if "requirepass" in a]
            secrets = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
            assert {s["secretName"] for s in secrets.values()} == {"slea-redis"}, doc["metadata"]["name"]
            if doc["kind"] in RAY_KINDS:
                ((name, secret),) = secrets.items()
                assert secret["items"] == [{"key": "password", "path": password_name}]  # not the exporter's key
                for container in spec["containers"]:
                    assert {"name": name, "mountPath": password_dir, "readOnly": True} in container["volumeMounts"]
    assert not any(doc["kind"] == "Secret" for doc in rendered[overlay]), "passwords never ship in the manifests"


def _pod_templates(doc: dict) -> list[dict]:
    if doc["kind"] == "StatefulSet":
        return [doc["spec"]["template"]]
    return [group["template"] for group in ray_pod_groups(next(iter(ray_cluster_specs([doc]).values()))).values()]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_is_durable_and_reachable(rendered, overlay):
    service = find(rendered[overlay], "Service", "slea-redis")
    statefulset = find(rendered[overlay], "StatefulSet", "slea-redis")
    pod = statefulset["spec"]["template"]
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    args = container["args"]
    config_map = next(doc for doc in rendered[overlay] if doc["kind"] == "ConfigMap")
    conf = dict(line.split(" ", 1) for line in config_map["data"]["redis.conf"].splitlines() if line and line[0] != "#")
    assert (conf["appendonly"], conf["maxmemory-policy"]) == ("yes", "noeviction")
    assert args[1] == "/etc/slea-redis/config/redis.conf" and "--appendonly" not in args
    limit = container["resources"]["limits"]["memory"]
    maxmemory = args[args.index("--maxmemory") + 1]
    units = {"Mi": 2**20, "Gi": 2**30, "mb": 2**20, "gb": 2**30}
    to_bytes = lambda size: int(size[:-2]) * units[size[-2:]]  # noqa: E731
    assert 0.5 <= to_bytes(maxmemory) / to_bytes(limit) <= 0.8, f"maxmemory {maxmemory} for a {limit} limit"
    data_dir = args[args.index("--dir") + 1]
    claim = statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    assert {"name": claim, "mountPath": data_dir} in container["volumeMounts"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[service["spec"]["ports"][0]["targetPort"]] == service["spec"]["ports"][0]["port"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ray_pods_expose_what_monitoring_and_serve_expect(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    podmonitor = yaml.safe_load((REPO / "monitoring/prometheus/podmonitor.yaml").read_text())
    endpoint = podmonitor["spec"]["podMetricsEndpoints"][0]
    run_label = next(r for r in endpoint["relabelings"] if r["targetLabel"] == "run")["sourceLabels"][0]
    for where, cluster in ray_cluster_specs(rendered[overlay]).items():
        assert cluster["rayVersion"] == version("ray"), f"{where}: rayVersion must be the Ray the project runs"
        for name, group in ray_pod_groups(cluster).items():
            template = group["template"]
            ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
            assert ports[endpoint["port"]] == int(group["rayStartParams"]["metrics-export-port"]), f"{where} {name}"
            label = re.sub(r"[^a-zA-Z0-9_]", "_", "slea.io/run")
            assert run_label == f"__meta_kubernetes_pod_label_{label}"
            # the RayJob's run id is its pods' label (SLEA_RUN_ID); the library RayService's pods carry
            # the label of the run it serves
            assert template["metadata"]["labels"]["slea.io/run"] == config.run.id, f"{where} {name}: run label"
            assert template["spec"]["securityContext"]["runAsNonRoot"] is True
            if name in ("head", "library"):
                assert ports["serve"] == config.library.http_port


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rayservice_serves_the_library_app_as_configured(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    serve = yaml.safe_load(find(rendered[overlay], "RayService")["spec"]["serveConfigV2"])
    assert serve["http_options"]["port"] == config.library.http_port
    (app,) = serve["applications"]
    module_name, _, attribute = app["import_path"].partition(":")
    module = REPO / (module_name.replace(".", "/") + ".py")
    assert module.is_file(), f"{app['import_path']}: no such module"
    source = module.read_text()  # read, not imported: importing the app pulls in Serve and the embedder
    assert re.search(rf"^def {attribute}\(args", source, re.M), (
        f"{app['import_path']}: {module_name} defines no Serve application builder {attribute}(args)"
    )
    assert app["name"] == LIBRARY_APP, "app name differs from the one slea train deploys and actors look up"
    config_path = app["args"]["config"]
    assert (REPO / config_path.removeprefix("/app/")).is_file()
    served = load_config(REPO / config_path.removeprefix("/app/"), app["args"].get("overrides", []))
    assert served.library.follow == "current", (
        "the RayService must serve the run that is training: no run id is known to it in advance (issue 22)"
    )
    (deployment,) = app["deployments"]
    assert re.search(rf"^class {deployment['name']}\b", source, re.M), f"no deployment class {deployment['name']}"
    base = entrypoint_config({"spec": {"entrypoint": f"slea train {config_path}"}})[0].library
    assert deployment["autoscaling_config"] == {
        "min_replicas": base.replicas,
        "max_replicas": base.max_replicas,
        "target_ongoing_requests": base.target_ongoing_requests,
    }
    assert (deployment["max_ongoing_requests"], deployment["max_queued_requests"]) == (
        base.max_ongoing_requests,
        base.max_queued_requests,
    ), "the RayService bounds differ from the config's"
    assert serve["http_options"]["host"] == base.http_host == "0.0.0.0", "Serve must answer other pods in the cluster"
    library_pool = custom_resources(
        ray_pod_groups(find(rendered[overlay], "RayService")["spec"]["rayClusterConfig"])["library"]
    )
    assert deployment["ray_actor_options"]["resources"]["library_pool"] <= library_pool["library_pool"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_ray_cluster_requires_a_token_from_a_secret(rendered, overlay):
    for where, cluster in ray_cluster_specs(rendered[overlay]).items():
        assert cluster["authOptions"] == {"mode": "token", "secretName": "slea-ray-token"}, where
        assert Version(version("ray")) >= Version("2.52.0"), "Ray token authentication needs Ray 2.52 or later"
