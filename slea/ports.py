"""Free TCP ports for the services a run starts itself (embedded Redis, DeepSpeed rendezvous)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now at `host` ("" = every interface, for peers on other nodes).
    The caller binds it soon after; another process may still take it in between."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
