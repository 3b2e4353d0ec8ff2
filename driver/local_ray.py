"""A Ray that slea starts on this machine listens on 127.0.0.1 only (issue 22, item 6).

Ray binds its servers (the GCS, the raylet, each worker's gRPC port, the agents) to the node's
address, and to every interface when that address is routable, which it is unless
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: the switch Ray itself flips on laptops
(ray/_private/services.py get_node_ip_address), under which the node address is 127.0.0.1 and every
server loopback-only. Nothing of a local run needs another machine (Serve's HTTP proxy, Redis and
the metrics already bind 127.0.0.1 by default), so `slea train` and `slea bench` flip it for a Ray
they start. Ray reads the switch when it is imported, so this runs before anything imports ray;
a cluster (`ray.address` set) is joined with Ray's own node address, as before.

Its token authentication is asked for by name (RAY_AUTH_MODE=token, unless the user set the
variable): Ray 2.60 turns it on by default for a local cluster anyway, and then logs a WARNING
saying it did (ray/_private/authentication/authentication_token_setup.py,
enable_token_auth_by_default), the third line of every run; with the mode set it says nothing.
"""

from __future__ import annotations

import os

LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE = "RAY_AUTH_MODE"


def keep_local_ray_on_loopback() -> None:
    """Make the local Ray this process starts listen on 127.0.0.1 only. Where ray is imported
    already (a test calling the CLI in-process) Ray has read the switch, and its node keeps Ray's
    default address. Its token authentication is asked for (the module docstring)."""
    os.environ[LOOPBACK_SWITCH] = "0"
    os.environ.setdefault(AUTH_MODE, "token")
