"""Fixtures of the deploy tests: the rendered overlays and the KubeRay CRD schemas."""

from __future__ import annotations

import pytest
import yaml
from cluster_network import configured_k8s
from k8s_render import OVERLAYS, kustomize
from required_tools import kuberay_crds


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Overlay name -> its rendered manifests, the GPU overlay's apiServerCIDR set as a user sets it."""
    k8s = configured_k8s(tmp_path_factory.mktemp("deploy"))
    return {overlay: kustomize(k8s / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def kuberay_schemas() -> dict[str, dict]:
    """Kind -> the v1 OpenAPI v3 schema of the KubeRay CRD, from the directory $SLEA_KUBERAY_CRDS names."""
    schemas = {}
    for path in sorted(kuberay_crds().glob("ray.io_*.yaml")):
        crd = yaml.load(
            path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )  # the C parser: these files are large
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return schemas
