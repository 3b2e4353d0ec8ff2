"""Run state outlives pods: run.dir is on the ReadWriteMany claim slea-runs, mounted by every Ray
pod that writes run state; scratch space has ephemeral-storage requests and limits; every
submission of the RayJob gets a run id of its own, which the Redis ACL lets the system use."""

from __future__ import annotations

import time

import pytest
from k8s_render import OVERLAYS, REPO, entrypoint_argv, entrypoint_config, find, pods, ray_cluster_specs, ray_pod_groups

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
def test_each_submission_gets_its_own_run_id(rendered, overlay):
    entrypoint = find(rendered[overlay], "RayJob")["spec"]["entrypoint"]
    ids = []
    for _ in range(2):
        argv = entrypoint_argv(entrypoint)
        ids.append(next(value.split("=", 1)[1] for value in argv if value.startswith("run.id=")))
        time.sleep(1.1)  # the id has one-second resolution; one RayJob submission at a time
    assert ids[0] != ids[1], "two submissions would share a run id (and silently append to one stream)"
    for run_id in ids:
        RunConfig(id=run_id)  # a valid run id: no spaces, ':' or slashes
        assert run_id.startswith("cluster"), "the Redis ACL lets the system use slea:cluster* keys only"


def test_the_readme_says_how_to_resume_a_run_by_id():
    readme = (REPO / "deploy" / "README.md").read_text()
    assert "--resume /mnt/slea-runs/" in readme
    assert "kubectl delete rayjob slea-train && kubectl apply" not in readme, "scaling must not restart the run"
