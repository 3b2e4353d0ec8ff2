"""A real policy scanner (checkov's Kubernetes checks) on both rendered overlays, every Ray pod
included: any finding not accepted, with its reason, in deploy/README.md fails; so does an
accepted finding that no longer occurs (the table must say what is true)."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
from k8s_render import OVERLAYS, REPO, find, ray_pod_groups
from policy_scan import accepted_findings, findings, unaccepted
from required_tools import checkov_command


@pytest.fixture(scope="module")
def scanned(rendered, tmp_path_factory) -> dict[str, list[tuple[str, str, str]]]:
    return {overlay: findings(rendered[overlay], tmp_path_factory.mktemp(overlay)) for overlay in OVERLAYS}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_finding_beyond_the_accepted_ones(scanned, overlay):
    left = unaccepted(scanned[overlay], accepted_findings())
    assert not left, "checkov findings not accepted in deploy/README.md:\n" + "\n".join(map(str, left))


def test_every_accepted_finding_still_occurs(scanned):
    every = [finding for overlay in OVERLAYS for finding in scanned[overlay]]
    for accepted in accepted_findings():
        assert unaccepted(every, [accepted]) != every, f"accepted finding no longer occurs, remove it: {accepted}"


def test_unrestricted_containers_are_findings_inside_ray_resources_too(rendered, tmp_path):
    """checkov alone would not look inside a RayJob: a Ray worker stripped of its restrictions must
    be caught as well as the Redis container."""
    manifests = copy.deepcopy(rendered["cpu-kind"])
    del find(manifests, "StatefulSet", "slea-redis")["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    actors = ray_pod_groups(find(manifests, "RayJob")["spec"]["rayClusterSpec"])["actors"]
    actors["template"]["spec"]["containers"][0]["securityContext"] = {}
    left = unaccepted(findings(manifests, tmp_path), accepted_findings())
    for resource in ("StatefulSet/slea-redis", "Pod/slea-train-actors"):
        assert {check for check, where, _name in left if where == resource} >= {"CKV_K8S_20", "CKV_K8S_22"}, resource


@pytest.mark.parametrize("image", ["cpu", "gpu"])
def test_the_images_dockerfiles_pass_checkovs_dockerfile_checks(image, tmp_path):
    """The Dockerfile checks (users, pinned bases, no ADD of URLs, a stated HEALTHCHECK...), no exception."""
    dockerfile = tmp_path / "Dockerfile"  # checkov's dockerfile runner knows files by that name
    dockerfile.write_text((REPO / "deploy" / "docker" / f"Dockerfile.{image}").read_text())
    command = [*checkov_command(), "--file", str(dockerfile), "--framework", "dockerfile"]
    result = subprocess.run(
        [*command, "--output", "json", "--compact", "--quiet", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(result.stdout)
    assert report["summary"]["parsing_errors"] == 0 and report["summary"]["passed"] > 50, report["summary"]
    failed = [(check["check_id"], check["check_name"]) for check in report["results"]["failed_checks"]]
    assert not failed, f"Dockerfile.{image}: {failed}"
