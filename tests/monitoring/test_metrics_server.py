"""The prometheus-client metrics server of a run outside Ray listens on loopback unless told otherwise."""

from __future__ import annotations

import urllib.request

from helpers import listening_addresses

from monitoring.metrics import serve_metrics


def test_metrics_server_listens_on_loopback_by_default():
    port = serve_metrics(0)
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).status == 200
    assert listening_addresses(port) == {"127.0.0.1"}  # not 0.0.0.0: no other interface reaches it


def test_metrics_host_opens_it_to_every_interface():
    port = serve_metrics(0, address="0.0.0.0")
    assert listening_addresses(port) == {"0.0.0.0"}
