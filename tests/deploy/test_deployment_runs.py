"""The deployment runs before a user's first `kubectl apply` (issue 35): the cpu-kind overlay's pods
run on this machine as KubeRay and the kubelet would start them (tests/deploy/deployment.py,
kuberay_pods.py, pod_sandbox.py, image_layout.py), with the Secrets made as deploy/README.md says.

Sizes are the overlay's where they fit this machine (2 cores): one actor pod, short episodes
(SETTINGS, appended to the entrypoint after the overlay's own).
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import yaml
from deployment import Deployment
from image_layout import bake
from pod_network import can_make_pod_networks
from pod_sandbox import NO_PROXY
from required_tools import under_ci

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)

RUN = "cluster-deploy"  # a new run is a new slea.io/run label (deploy/README.md), under the ACL's slea:cluster*
GROUP_SIZE = 2
SETTINGS = [  # appended to the overlay's entrypoint: this machine's sizes
    "actors.num_workers=1",
    "actors.envs_per_worker=2",
    f"actors.group_size={GROUP_SIZE}",
    "actors.max_staleness=1000",
    "envs.max_steps=3",
    "envs.panel_size=4",
    "model.max_new_tokens=8",
    "learner.tasks_per_step=1",
    "learner.max_steps=4",
    "learner.checkpoint_every=1",
    "learner.max_staleness=1000",
    "library.snapshot_every=1",
    "eval.every=0",
]
WORKERS = {"actors": 1, "learner": 1, "library": 1}


def _wait(what: str, condition, timeout_s: float, deployment: Deployment, pods: list[str]):
    """Polls `condition` until it holds; fails at once when the attempt's submitter (pods[0]) has
    ended, since its job then can no longer make it hold."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        submitter = deployment.node.pods.get(pods[0])
        if submitter is not None and "job-name" not in submitter.labels and not submitter.running():
            break
        time.sleep(2)
    logs = "\n".join(f"===== {pod}\n{deployment.node.tails(pod, 3000)}" for pod in pods if pod in deployment.node.pods)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s, or its job ended\n{logs}")


def _job(deployment: Deployment, head: str, job_id: str) -> dict:
    """The job as KubeRay reads it: GET /api/jobs/<id> on the head's dashboard, with the token."""
    request = urllib.request.Request(
        f"http://{deployment.node.pods[head].ip}:8265/api/jobs/{job_id}",
        headers={"Authorization": f"Bearer {deployment.ray_token}"},
    )
    with NO_PROXY.open(request, timeout=10) as response:
        return json.loads(response.read())


def test_the_rayjob_entrypoint_starts_the_run_its_pods_are_labelled_for(tmp_path):
    """Redis from its StatefulSet, the RayJob's cluster (a head and one pod of each worker group)
    and KubeRay's submitter with the real entrypoint: the job runs `slea train` for the run the
    pods' slea.io/run label names, its run directory on the run-state claim, every Ray pod's
    readiness probe green. On the entrypoint before issue 35 the submitter's bash expanded
    `${SLEA_RUN_ID}` to nothing and the job failed at once ("bad value for 'run.id' ... got ''")."""
    if reason := can_make_pod_networks():
        pytest.fail(reason) if under_ci() else pytest.skip(reason)
    tmp_path.chmod(0o755)  # the pods' users (1000, 999) reach their volumes under it
    deployment = Deployment(tmp_path / "node", bake(tmp_path / "image"))
    try:
        deployment.start_redis()
        attempt = deployment.start_attempt(deployment.rayjob(RUN, SETTINGS), WORKERS)
        pods = [attempt.submitter, attempt.head, *(p for ps in attempt.workers.values() for p in ps)]
        run_dir = deployment.node.claim("slea-runs") / RUN
        _wait("the run's directory on the claim", lambda: (run_dir / "config.yaml").exists(), 600, deployment, pods)
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["id"] == RUN
        job = _wait(
            "the job running",
            lambda: (
                _job(deployment, attempt.head, attempt.job_id)["status"] == "RUNNING"
                and _job(deployment, attempt.head, attempt.job_id)
            ),
            120,
            deployment,
            pods,
        )
        assert job["entrypoint"].endswith(SETTINGS[-1]), job["entrypoint"]
        for name in pods[1:]:
            assert all(c.ever_ready for c in deployment.node.pods[name].containers.values()), (
                f"{name}: readiness never passed"
            )
    finally:
        deployment.close()
