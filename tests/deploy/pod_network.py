"""A pod network on this machine: one Linux bridge, and one network namespace per pod with its
own address on it, the way a CNI plugin gives each pod an IP and an `eth0`.

Every pod can listen on the same ports (Ray's 6379, 8265, 8080, 52365 on every node) because each
has a namespace of its own. The subnet is one the tests make themselves, inside this machine: the
host does not forward (net.ipv4.ip_forward is left as it is, 0 here), so nothing a pod sends leaves
the box. Pods get a default route over the bridge as pods do, so Ray's "which address do I
have" lookup (a UDP connect, which sends nothing) finds the pod IP. Needs root (CI runs as root).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
import threading


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def can_make_pod_networks() -> str | None:
    """None where this process can make namespaces and bridges, else why not."""
    if os.geteuid() != 0:
        return "the pod network needs root (network namespaces, a bridge); CI runs as root"
    for program in ("ip", "bwrap", "setpriv"):
        if subprocess.run(["sh", "-c", f"command -v {program}"], capture_output=True).returncode:
            return f"{program} not found (apt-get install iproute2 bubblewrap util-linux)"
    return None


class PodNetwork:
    """The bridge and the pods' namespaces of one test run; `close` removes all of them."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)  # interface names hold 15 characters: keep them short
        self.subnet = ipaddress.ip_network(f"10.244.{int(self.tag, 16) % 250 + 1}.0/24")
        hosts = self.subnet.hosts()
        self.gateway = str(next(hosts))
        self._free = (str(address) for address in hosts)
        self.bridge = f"slbr{self.tag}"
        self.namespaces: dict[str, str] = {}  # pod name -> namespace
        self._made = 0
        self._lock = threading.Lock()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def attach(self, pod: str) -> tuple[str, str]:
        """A namespace for a new pod and its address: (namespace, pod IP)."""
        with self._lock:
            address, index = next(self._free), self._made
            self._made += 1
        netns, veth = f"slns{self.tag}{index}", f"slv{self.tag}{index}"
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        _ip("route", "add", "default", "via", self.gateway, netns=netns)
        self.namespaces[pod] = netns
        return netns, address

    def detach(self, pod: str) -> None:
        """The pod is gone: its namespace (and with it its end of the veth pair) goes too."""
        if netns := self.namespaces.pop(pod, None):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)

    def close(self) -> None:
        for pod in list(self.namespaces):
            self.detach(pod)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
