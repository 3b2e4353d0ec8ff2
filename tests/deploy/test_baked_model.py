"""The CPU image's baked policy loads in a pod as the deployment runs it: read-only image, offline.

deploy/docker/Dockerfile.cpu converts the shipped SmolLM2 (a GGUF in a PyPI package) into
SLEA_CACHE_DIR while the image is built, because a pod cannot: its image is read-only
(readOnlyRootFilesystem) and nothing is downloaded. The deployment test
(tests/deploy/test_deployment_runs.py) plays the tiny test policy baked the same way, so this is
where the model the overlay names is loaded in the learner's pod (its manifest, its user, its
volumes: tests/deploy/pod_sandbox.py) from the Dockerfile's own bake; and where, without the
bake, the same pod fails, the failure this test exists for.
"""

from __future__ import annotations

import re
import time

import kuberay_pods
import pytest
from deployment import NAMESPACE, Deployment
from image_layout import bake, image_caches
from k8s_render import find
from pod_network import can_make_pod_networks
from required_tools import under_ci

pytestmark = pytest.mark.slow


def _model_the_overlay_names(deployment: Deployment) -> str:
    """model.name from the RayJob's rendered entrypoint (the cpu-kind overlay's)."""
    entrypoint = find(deployment.manifests, "RayJob", "slea-train")["spec"]["entrypoint"]
    return re.search(r"--set model\.name=(\S+)", entrypoint).group(1)


def _run_in_learner_pod(deployment: Deployment, code: str, timeout_s: float = 300) -> tuple[int, str]:
    """The RayJob's learner worker pod as KubeRay makes it, its command replaced by `python -c code`
    (no init container waiting for a GCS, no probes, restartPolicy Never): (exit code, its log)."""
    rayjob = find(deployment.manifests, "RayJob", "slea-train")
    pod = kuberay_pods.ray_pod(
        rayjob["spec"]["rayClusterSpec"], "learner", "bake-check", "bake-check-learner", NAMESPACE, "RayJob"
    )
    spec = pod["spec"]
    spec.pop("initContainers", None)
    spec["restartPolicy"] = "Never"
    container = spec["containers"][0]
    for key in ("args", "readinessProbe", "livenessProbe", "lifecycle"):
        container.pop(key, None)
    container["command"] = ["python", "-c", code]
    running = deployment.node.start(pod).containers[container["name"]]
    deadline = time.monotonic() + timeout_s
    while not running.exit_codes and time.monotonic() < deadline:
        time.sleep(1)
    assert running.exit_codes, f"the pod did not exit in {timeout_s:.0f} s:\n{running.log.read_text()[-3000:]}"
    return running.exit_codes[0], running.log.read_text(errors="replace")


def test_the_learner_pod_loads_the_baked_policy_and_without_the_bake_cannot(tmp_path):
    if reason := can_make_pod_networks():
        pytest.fail(reason) if under_ci() else pytest.skip(reason)
    tmp_path.chmod(0o755)  # the pod's user (1000) reaches its volumes under it
    baked = Deployment(tmp_path / "baked", bake(tmp_path / "image"))
    unbaked = Deployment(tmp_path / "unbaked", image_caches(tmp_path / "empty-image"))
    try:
        name = _model_the_overlay_names(baked)
        load = (
            "from slea.models import load_model; "
            f"model, tokenizer = load_model({name!r}); "
            "print('loaded', model.num_parameters(), 'parameters and', len(tokenizer), 'tokens')"
        )
        code, log = _run_in_learner_pod(baked, load)
        assert code == 0 and re.search(r"loaded \d+ parameters and \d+ tokens", log), log[-3000:]
        code, log = _run_in_learner_pod(unbaked, load)
        assert code != 0 and "Read-only file system" in log and "SLEA_CACHE_DIR" in log, (
            f"the policy loaded with no bake (exit {code}): the image's cache is not read-only as a pod's is\n"
            + log[-3000:]
        )
    finally:
        baked.close()
        unbaked.close()
