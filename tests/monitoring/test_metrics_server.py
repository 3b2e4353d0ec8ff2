"""The prometheus-client metrics server of a run outside Ray listens on loopback unless told otherwise."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from monitoring.metrics import serve_metrics


def _outbound_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # UDP connect sends nothing; it only picks the interface
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_metrics_server_listens_on_loopback_by_default():
    port = serve_metrics(0)
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).status == 200
    address = _outbound_address()
    if address is None:
        pytest.skip("no non-loopback address on this machine to try")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address, port), timeout=5).close()
