"""Fixtures of the deploy tests: the rendered overlays and the KubeRay CRD schemas."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from k8s_render import K8S, OVERLAYS, REPO, kustomize


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """Overlay name -> its rendered manifests."""
    return {overlay: kustomize(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def kuberay_schemas() -> dict[str, dict]:
    """Kind -> the v1 OpenAPI v3 schema of the KubeRay CRD, from ../shared/schemas/kuberay."""
    for root in (REPO.parent / "shared" / "schemas" / "kuberay", Path("/work/shared/schemas/kuberay")):
        if root.is_dir():
            break
    else:
        pytest.skip(
            "KubeRay CRD schemas not found (../shared/schemas/kuberay beside the repository): Ray kinds not validated"
        )
    schemas = {}
    for path in sorted(root.glob("ray.io_*.yaml")):
        crd = yaml.load(
            path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )  # the C parser: these files are large
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return schemas
