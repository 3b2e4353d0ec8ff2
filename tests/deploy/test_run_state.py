"""Run state outlives pods: run.dir is on the ReadWriteMany claim slea-runs, mounted by every Ray
pod that writes run state; scratch space has ephemeral-storage requests and limits; every
retry of the RayJob resumes the same run, whose id the Redis ACL lets the system use."""

from __future__ import annotations

import pytest
from k8s_render import (
    OVERLAYS,
    REPO,
    entrypoint_argv,
    entrypoint_config,
    find,
    head_environment,
    pods,
    ray_cluster_specs,
    ray_pod_groups,
)

from slea.config import RunConfig

CLAIM = "slea-runs"
# The pods of the training cluster that write run state: the driver on the head (the run's config
# and metrics), the learner (checkpoints) and the library writer (snapshots). Actors write only
# to the stream.
WRITERS = {"head", "learner", "library"}


def _claim_mounts(spec: dict) -> set[str]:
    claimed = {
        v["name"] for v in spec.get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName") == CLAIM
    }
    return {m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] in claimed}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_ray_pod_that_writes_run_state_mounts_the_claim(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    (cluster,) = ray_cluster_specs([find(rendered[overlay], "RayJob")]).values()
    mounting = {name for name, group in ray_pod_groups(cluster).items() if _claim_mounts(group["template"]["spec"])}
    assert mounting == WRITERS, f"pods mounting {CLAIM}: {sorted(mounting)}"
    for name in WRITERS:
        spec = ray_pod_groups(cluster)[name]["template"]["spec"]
        assert _claim_mounts(spec) == {config.run.dir}, f"{name}: run.dir {config.run.dir} is not where the claim is"
    claim = find(rendered[overlay], "PersistentVolumeClaim", CLAIM)
    # kind's local-path storage offers only ReadWriteOnce (one node: every pod can mount it)
    assert claim["spec"]["accessModes"] == (["ReadWriteMany"] if overlay == "gpu" else ["ReadWriteOnce"])


def test_the_cluster_configs_keep_run_state_on_the_mount(rendered):
    from slea.config import load_config

    (cluster,) = ray_cluster_specs([find(rendered["gpu"], "RayJob")]).values()
    mount = _claim_mounts(ray_pod_groups(cluster)["learner"]["template"]["spec"])
    for name in ("cluster.yaml", "gpu.yaml"):
        assert {load_config(REPO / "configs" / name).run.dir} == mount, f"configs/{name}: run.dir is not the mount"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scratch_space_has_ephemeral_storage_requests_and_limits(rendered, overlay):
    """Every container with a disk-backed emptyDir (Ray's /tmp: session, logs, model caches) says
    how much node disk it uses, so the kubelet neither overcommits the node nor evicts by surprise."""
    for where, spec in pods(rendered[overlay]).items():
        scratch = {
            v["name"] for v in spec.get("volumes", []) if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
        }
        for container in spec["containers"]:
            if not {m["name"] for m in container.get("volumeMounts", [])} & scratch:
                continue
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert "ephemeral-storage" in resources.get(kind, {}), (
                    f"{where} {container['name']}: no ephemeral-storage {kind}"
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_retry_resumes_the_same_run(rendered, overlay):
    """backoffLimit retries a failed attempt on a new Ray cluster; its entrypoint must name the same
    run (the pods' slea.io/run label, not the time of the attempt) and resume its directory."""
    rayjob = find(rendered[overlay], "RayJob")
    assert rayjob["spec"]["backoffLimit"] >= 1, "a failed attempt must be retried"
    attempts = [entrypoint_argv(rayjob["spec"]["entrypoint"], head_environment(rayjob)) for _ in range(2)]
    assert attempts[0] == attempts[1], "two attempts of one submission must run the same command"
    assert "--resume-existing" in attempts[0], "a retry must continue the run the failed attempt left"
    run_id = entrypoint_config(rayjob)[0].run.id
    RunConfig(id=run_id)  # a valid run id: no spaces, ':' or slashes
    assert run_id.startswith("cluster"), "the Redis ACL lets the system use slea:cluster* keys only"
    for where, cluster in ray_cluster_specs(rendered[overlay]).items():
        if where.startswith("RayJob"):
            for name, group in ray_pod_groups(cluster).items():
                assert group["template"]["metadata"]["labels"]["slea.io/run"] == run_id, f"{where} {name}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_and_their_gpus_go_within_a_minute_of_the_end(rendered, overlay):
    spec = find(rendered[overlay], "RayJob")["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] <= 60


VOLUME_REATTACH_S = 360  # Kubernetes' attach-detach controller force-detaches a lost node's volume after 6 minutes
AOF_REPLAY_BYTES_PER_S = 50e6  # a conservative AOF load rate


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_components_wait_out_a_rescheduled_redis_and_its_aof_replay(rendered, overlay):
    config, _ = entrypoint_config(find(rendered[overlay], "RayJob"))
    redis_pod = next(doc for doc in rendered[overlay] if doc["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    args = redis_pod["containers"][0]["args"]
    maxmemory = args[args.index("--maxmemory") + 1]
    units = {"gb": 1e9, "mb": 1e6}
    assert maxmemory[-2:] in units, f"maxmemory {maxmemory}: the test reads gb or mb"
    replay_s = float(maxmemory[:-2]) * units[maxmemory[-2:]] / AOF_REPLAY_BYTES_PER_S
    assert config.redis.reconnect_max_s >= VOLUME_REATTACH_S + replay_s
    assert config.redis.retention_s is not None, "finished runs would fill a noeviction Redis"


EXIT_ALLOWANCE_S = 60  # after the driver's last wait: Serve's and Ray's shutdown, the processes exit


def _stop_waits() -> dict[str, float]:
    """Pod group -> the driver's waits its pods must outlive after a SIGTERM. The graceful stop
    (driver/train.py _shutdown) goes in order: the actors stop, the learner checkpoints, the
    library snapshots; the head runs it all."""
    from actors.pool import RETIRE_TIMEOUT_S
    from driver.train import LEARNER_CHECKPOINT_WAIT_S, LIBRARY_SNAPSHOT_WAIT_S

    actors = RETIRE_TIMEOUT_S
    learner = actors + LEARNER_CHECKPOINT_WAIT_S
    library = learner + LIBRARY_SNAPSHOT_WAIT_S
    return {"actors": actors, "learner": learner, "library": library, "head": library}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_outlive_the_graceful_stop_on_sigterm(rendered, overlay):
    """Kubernetes kills a pod terminationGracePeriodSeconds (default 30 s) after its SIGTERM: every
    pod of the training cluster must outlive the driver's waits up to the end of its own step."""
    (cluster,) = ray_cluster_specs([find(rendered[overlay], "RayJob")]).values()
    groups = ray_pod_groups(cluster)
    needed = _stop_waits()
    assert set(groups) == set(needed), f"pod groups {sorted(groups)}: say what each must outlive"
    for name, group in groups.items():
        grace = group["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        assert grace >= needed[name] + EXIT_ALLOWANCE_S, (
            f"{overlay} {name}: terminationGracePeriodSeconds {grace} < {needed[name]:.0f} s of the driver's stop "
            f"+ {EXIT_ALLOWANCE_S} s"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_deleted_pod_stops_the_run_before_ray_start_hears_the_sigterm(rendered, overlay):
    """Every Ray container of the training cluster has `slea pod-stop` as its preStop hook: on the
    SIGTERM `ray start --block` kills its node's Ray processes within 30 s, so the driver's stop
    must run before it (driver/pod_stop.py; the deployment test shows the checkpoint it writes).
    KubeRay's StopJob on a RayJob's deletion lets Ray's job supervisor wait
    RAY_JOB_STOP_WAIT_TIME_S after its SIGTERM to the driver (3 s when unset) before SIGKILL."""
    from driver.cli import build_parser

    (cluster,) = ray_cluster_specs([find(rendered[overlay], "RayJob")]).values()
    needed = _stop_waits()
    assert build_parser().parse_args(["pod-stop"]).timeout_s >= needed["head"], "the hook gives up before the stop ends"
    for name, group in ray_pod_groups(cluster).items():
        for container in group["template"]["spec"]["containers"]:
            hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            assert hook == ["slea", "pod-stop"], f"{overlay} {name}: preStop {hook}"
            env = {v["name"]: v.get("value") for v in container.get("env", [])}
            if name == "head":
                assert float(env.get("RAY_JOB_STOP_WAIT_TIME_S", 3)) >= needed["head"], (
                    f"{overlay}: RAY_JOB_STOP_WAIT_TIME_S {env.get('RAY_JOB_STOP_WAIT_TIME_S')} < the driver's stop"
                )


def test_resume_existing_continues_a_run_whose_directory_exists(tmp_path):
    """What the entrypoint decides on a retry: a new run the first time, that run's directory after."""
    from driver.cli import existing_run
    from slea.config import load_config
    from slea.services import prepare_run_dir

    config = load_config(None, [f"run.dir={tmp_path}", "run.id=cluster-a"])
    assert existing_run(config) is None
    prepare_run_dir(config)
    assert existing_run(config) == str(tmp_path / "cluster-a")


def test_the_readme_says_how_to_resume_a_run_by_id():
    readme = (REPO / "deploy" / "README.md").read_text()
    assert "--resume /mnt/slea-runs/" in readme
    assert "kubectl delete rayjob slea-train && kubectl apply" not in readme, "scaling must not restart the run"
