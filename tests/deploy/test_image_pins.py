"""Images you can rebuild (issue 22, item 8): the overlays name one build of the image, by its own
tag or its digest, never a mutable `slea-rl:cpu`/`slea-rl:gpu`; scripts/pin_image.py (which
scripts/build_image.sh runs after a build) rewrites that name and nothing else."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from cluster_network import configured_k8s
from k8s_render import K8S, REPO, kustomize

OVERLAYS = {"cpu": K8S / "overlays" / "cpu-kind", "gpu": K8S / "overlays" / "gpu"}
DIGEST = "sha256:" + "0123456789abcdef" * 4


def images_of(manifests: list[dict]) -> set[str]:
    """Every container image of the rendered manifests that is the project's own."""
    return set(re.findall(r"image: (\S*slea-rl\S*)", yaml.safe_dump_all(manifests)))


@pytest.mark.parametrize("flavour", OVERLAYS)
def test_the_shipped_overlays_name_no_mutable_tag(flavour):
    block = yaml.safe_load((OVERLAYS[flavour] / "kustomization.yaml").read_text())["images"]
    (entry,) = [image for image in block if image["name"] == "slea-rl"]
    tag = entry.get("newTag")
    assert tag not in (flavour, "latest", None) or "digest" in entry, f"{flavour}: mutable tag {tag}"
    assert "digest" in entry or re.fullmatch(rf"{flavour}-([0-9a-f]{{12}}|unbuilt)", tag), tag


@pytest.mark.parametrize(
    ("flavour", "reference", "rendered"),
    [
        ("cpu", "slea-rl:cpu-0123456789ab", "slea-rl:cpu-0123456789ab"),
        ("gpu", f"registry.example:5000/team/slea-rl@{DIGEST}", f"registry.example:5000/team/slea-rl@{DIGEST}"),
        ("gpu", "registry.example:5000/slea-rl:gpu-0123456789ab", "registry.example:5000/slea-rl:gpu-0123456789ab"),
    ],
)
def test_pinning_a_build_points_every_pod_at_it_and_changes_nothing_else(tmp_path, flavour, reference, rendered):
    copy = configured_k8s(tmp_path)
    overlay = copy / "overlays" / OVERLAYS[flavour].name
    before = (overlay / "kustomization.yaml").read_text()
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/pin_image.py"), str(overlay / "kustomization.yaml"), reference],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    after = (overlay / "kustomization.yaml").read_text()
    assert images_of(kustomize(overlay)) == {rendered}
    outside = lambda text: re.sub(r"^images:\n(?:[ ]+.*\n)+", "", text, flags=re.M)  # noqa: E731
    assert outside(after) == outside(before), "only the images block may change"


@pytest.mark.parametrize("reference", ["slea-rl", "registry:5000/slea-rl", "other:cpu-1", "slea-rl@sha256:short"])
def test_a_reference_that_names_no_build_is_refused(tmp_path, reference):
    target = tmp_path / "kustomization.yaml"
    target.write_text((OVERLAYS["cpu"] / "kustomization.yaml").read_text())
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/pin_image.py"), str(target), reference],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and reference.split("@")[0].split(":")[0] in result.stderr
