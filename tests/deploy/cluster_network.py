"""The GPU overlay's API-server address (overlays/gpu/cluster-network.yaml), which ships unset so
that `kubectl apply -k` stops until a user sets it: the tests set it in a copy of deploy/k8s, the
way that file tells a user to."""

from __future__ import annotations

import shutil
from pathlib import Path

from k8s_render import K8S

TEST_API_SERVER_CIDR = "10.96.0.1/32"
UNSET = "  # apiServerCIDR: <API server address>/32\n"


def set_api_server_cidr(k8s: Path, cidr: str = TEST_API_SERVER_CIDR) -> None:
    """Uncomment the key under `data:` with `cidr` as its value."""
    path = k8s / "overlays" / "gpu" / "cluster-network.yaml"
    text = path.read_text()
    assert text.count(UNSET) == 1, f"{path}: the unset apiServerCIDR line moved; update {__file__}"
    path.write_text(text.replace(UNSET, f"  apiServerCIDR: {cidr}\n"))


def configured_k8s(into: Path) -> Path:
    """A copy of deploy/k8s under `into` with the GPU overlay's apiServerCIDR set."""
    copied = into / "k8s"
    shutil.copytree(K8S, copied)
    set_api_server_cidr(copied)
    return copied
