"""The deployment runs before a user's first `kubectl apply` (issue 35): the cpu-kind overlay's pods
run on this machine as KubeRay and the kubelet would start them (tests/deploy/deployment.py,
kuberay_pods.py, pod_sandbox.py, image_layout.py), with the Secrets made as deploy/README.md says.

One run goes through what a deployment meets, in one test (each stage needs the one before, and
a Ray cluster takes a minute to start on 2 cores): Redis killed and restarted by the kubelet, the
head pod deleted (preStop hook, SIGTERM, its process tree gone) and the run retried, the
RayService serving the library, and the retry training to the end. An attempt lost whole without
a graceful stop (SIGKILL of every pod) is tests/test_cluster_resume.py's, on a plain Ray cluster:
a third attempt here cost CI some 200 s for the same resume path.

Sizes are the overlay's where they fit this machine (2 cores): one actor pod, short episodes
(SETTINGS, appended to the entrypoint after the overlay's own). The policy is the tiny test model,
baked into the image's cache as an image serving a model of one's own bakes it: nothing here is
about what the policy plays, and SmolLM2's loads and updates made this test 529 s on 2 cores (the
shipped policy's bake loads in a pod in tests/deploy/test_baked_model.py). Checkpoints and
snapshots only at a stop or the end (checkpoint_every, snapshot_every), so that one on the claim
after the head's deletion can only be the graceful stop's.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml
from deployment import Attempt, Deployment
from helpers import audit_the_stream, trained_steps
from image_layout import TINY_POLICY, bake_tiny_policy
from pod_network import can_make_pod_networks
from pod_sandbox import NO_PROXY
from required_tools import under_ci

from library.persistence import latest_snapshot
from slea.records import decode
from slea.streams import PAYLOAD_FIELD

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)

RUN = "cluster-deploy"  # a new run is a new slea.io/run label (deploy/README.md), under the ACL's slea:cluster*
GROUP_SIZE = 2
# The first attempt is stopped some steps after Redis's restart and the retry trains the rest: the
# tiny policy trains a step every few seconds, and with 12 the first attempt once reached v12 before
# its head was deleted (an AMX Xeon, 2026-12-07), leaving the retry nothing to train.
MAX_STEPS = 20
SETTINGS = [  # appended to the overlay's entrypoint: this machine's sizes
    f"model.name={TINY_POLICY}",
    "actors.num_workers=1",
    "actors.envs_per_worker=2",
    f"actors.group_size={GROUP_SIZE}",
    "actors.max_staleness=1000",
    "envs.max_steps=3",
    "envs.panel_size=4",
    "model.max_new_tokens=8",
    "learner.tasks_per_step=1",
    f"learner.max_steps={MAX_STEPS}",
    "learner.checkpoint_every=1000",
    "learner.max_staleness=1000",
    "library.snapshot_every=1000",
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


def _job_status(deployment: Deployment, head: str, job_id: str) -> str | None:
    """The job's status as KubeRay reads it: GET /api/jobs/<id> on the head's dashboard, with the
    token; None before the submitter has submitted it (404)."""
    request = urllib.request.Request(
        f"http://{deployment.node.pods[head].ip}:8265/api/jobs/{job_id}",
        headers={"Authorization": f"Bearer {deployment.ray_token}"},
    )
    try:
        with NO_PROXY.open(request, timeout=10) as response:
            return json.loads(response.read())["status"]
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def _checkpoint(run_dir: Path) -> dict | None:
    """The state.json of the newest complete checkpoint on the claim, None before the first."""
    root = run_dir / "learner" / "checkpoints"
    if not (root / "latest").exists():
        return None
    return json.loads((root / (root / "latest").read_text().strip() / "state.json").read_text())


def _start(deployment: Deployment, rayjob: dict, run_dir: Path) -> tuple[Attempt, list[str]]:
    """An attempt whose job is RUNNING, with the run's config on the claim."""
    attempt = deployment.start_attempt(rayjob, WORKERS)
    pods = deployment.pods_of(attempt)
    _wait("the run's directory on the claim", lambda: (run_dir / "config.yaml").exists(), 600, deployment, pods)
    _wait(
        "the job running",
        lambda: _job_status(deployment, attempt.head, attempt.job_id) == "RUNNING",
        120,
        deployment,
        pods,
    )
    return attempt, pods


@pytest.mark.timeout(1800)  # 403 s alone on a 2-core AMX Xeon: two attempts of a Ray cluster and a RayService
def test_the_deployment_trains_through_what_a_cluster_does_to_it(tmp_path):
    """1. The RayJob's entrypoint starts `slea train` for the run its pods are labelled for, every Ray
    pod's readiness probe goes green. On the entrypoint before issue 35 the submitter's bash
    expanded `${SLEA_RUN_ID}` to nothing and the job failed at once ("bad value for 'run.id'").
    2. Redis from its StatefulSet, SIGKILLed: the kubelet restarts it on the same claim, the stream
    is still there (AOF), and the run trains on.
    3. The head pod deleted: its preStop hook (`slea pod-stop`) stops the driver gracefully, and a
    checkpoint and a library snapshot are on the claim. Before, `ray start` (PID 1) killed the
    driver within 30 s of the SIGTERM, and nothing was written.
    4. The RayService, from its rendered serveConfigV2 deployed with the cluster's token, answers
    retrieval for the run the RayJob trains (its replica follows the current run in Redis as the
    ACL user the manifests give it).
    5. The retry (a new head and workers, the same labels and claim) resumes the same run from the
    checkpoint and trains to learner.max_steps: the job SUCCEEDED, and the stream audit
    (tests/helpers.py) is clean across every disruption."""
    if reason := can_make_pod_networks():
        pytest.fail(reason) if under_ci() else pytest.skip(reason)
    tmp_path.chmod(0o755)  # the pods' users (1000, 999) reach their volumes under it
    deployment = Deployment(tmp_path / "node", bake_tiny_policy(tmp_path / "image"))
    timings: list[str] = []
    started = time.monotonic()

    def mark(what: str) -> None:
        timings.append(f"{time.monotonic() - started:6.0f} s  {what}")

    client = None
    try:
        redis_pod = deployment.start_redis()
        client = redis.Redis(host=redis_pod.ip, username="slea", password=deployment.redis_password)
        stream = f"slea:{RUN}:steps"
        run_dir = deployment.node.claim("slea-runs") / RUN
        rayjob = deployment.rayjob(RUN, SETTINGS)

        # 1. The first attempt starts the run its pods are labelled for.
        first, pods = _start(deployment, rayjob, run_dir)
        # A group nobody reads keeps every entry for the audit at the end: the driver trims only what
        # every group acknowledged, and nothing is acknowledged before the first trained step. (Made
        # before the run, it would be refused: a new run will not take over an existing stream.)
        client.xgroup_create(stream, "audit", id="0", mkstream=True)
        mark("first attempt running")
        written = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert written["run"]["id"] == RUN and written["learner"]["max_steps"] == MAX_STEPS  # the settings went in
        for name in pods[1:]:
            assert all(c.ever_ready for c in deployment.node.pods[name].containers.values()), (
                f"{name}: readiness never passed"
            )
        _wait("a trained step", lambda: trained_steps(run_dir), 600, deployment, pods)
        mark("first trained step")

        # 2. Redis SIGKILLed; the kubelet restarts it on the same claim; the run trains on.
        entries = [entry_id for entry_id, _ in client.xrange(stream)]
        trained = len(trained_steps(run_dir))
        killed_at = time.monotonic()
        deployment.node.kill_container(redis_pod.name, "redis")
        _wait("Redis restarted", lambda: redis_pod.containers["redis"].restarts == 1, 60, deployment, pods)
        deployment.node.wait_ready(redis_pod.name, 120)
        assert [entry_id for entry_id, _ in client.xrange(stream, count=len(entries))] == entries, (
            "the stream lost entries across the restart: the AOF on the claim did not bring them back"
        )
        _wait(
            "a step trained after Redis came back", lambda: len(trained_steps(run_dir)) > trained, 600, deployment, pods
        )
        mark(f"Redis SIGKILLed, restarted, trained on after {time.monotonic() - killed_at:.0f} s")

        # 3. The head pod deleted: the preStop hook's graceful stop writes to the claim.
        assert _checkpoint(run_dir) is None and latest_snapshot(run_dir) is None, "written before any stop"
        report = deployment.node.delete(first.head)
        assert "preStop exited 0" in report["ray-head"], report
        checkpoint = _checkpoint(run_dir)
        assert checkpoint is not None, f"no checkpoint after the head's deletion: {report}"
        assert checkpoint["version"] == trained_steps(run_dir)[-1]["policy_version"], (
            checkpoint,
            trained_steps(run_dir)[-1],
        )
        assert latest_snapshot(run_dir) is not None, f"no library snapshot after the head's deletion: {report}"
        trained = len(trained_steps(run_dir))
        mark(f"head deleted at policy v{checkpoint['version']}: {report['ray-head']}")
        deployment.lose_attempt(first)  # KubeRay deletes the rest of the RayCluster before the retry

        # 4. The RayService, up before the retry: it follows whichever run is current in Redis.
        service = deployment.start_rayservice()
        mark("RayService ready")

        # 5. The retry resumes the run from the graceful stop's checkpoint; the RayService serves its
        # library while it trains; it trains to the end, and the stream adds up.
        second, pods = _start(deployment, rayjob, run_dir)
        _wait("a step trained in the retry", lambda: len(trained_steps(run_dir)) > trained, 600, deployment, pods)
        resumed = trained_steps(run_dir)[trained]
        assert resumed["policy_version"] == checkpoint["version"] + 1, (checkpoint, resumed)
        mark("the retry resumed from the checkpoint and trained")
        serve = deployment.node.pods[service.workers["library"][0]].ip
        health = json.loads(NO_PROXY.open(f"http://{serve}:8000/healthz", timeout=30).read())
        assert health["run"] == RUN and health["library_version"] is not None, health
        record = decode(client.xrange(stream, count=1)[0][1][PAYLOAD_FIELD])
        request = urllib.request.Request(
            f"http://{serve}:8000/retrieve",
            data=json.dumps({"observation": record.anchor_obs, "task_type": record.task_type}).encode(),
            headers={"Content-Type": "application/json"},
        )
        answer = json.loads(NO_PROXY.open(request, timeout=30).read())
        assert "experiences" in answer and answer["library_version"] is not None, answer
        mark(f"RayService answered for run {health['run']} at library version {health['library_version']}")

        _wait(
            "the job succeeded",
            lambda: _job_status(deployment, second.head, second.job_id) == "SUCCEEDED",
            900,
            deployment,
            pods,
        )
        mark("the retry trained to the end")
        assert _checkpoint(run_dir)["learner_step"] == MAX_STEPS
        assert (run_dir / "metrics.jsonl").exists()
        records = {entry_id.decode(): decode(fields[PAYLOAD_FIELD]) for entry_id, fields in client.xrange(stream)}
        audit_the_stream(records, client, stream, run_dir / "learner", GROUP_SIZE)
    finally:
        print("\n".join(timings))
        if client is not None:
            client.close()
        deployment.close()
