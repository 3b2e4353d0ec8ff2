"""Helpers shared by several test modules (importable as `helpers`: pytest puts tests/ on the path)."""

from __future__ import annotations

import numpy as np
import torch


def forward_logprobs(model, prompt_ids, response_ids, temperature: float = 1.0) -> np.ndarray:
    """Log-probs of `response_ids` recomputed by one teacher-forced forward pass of `model`."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    targets = torch.tensor(list(response_ids), dtype=torch.long)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1).numpy()


def serve_http_port() -> int:
    """A free port for Ray Serve's HTTP proxy, between Ray's worker ports (10002-19999) and the
    ephemeral range Ray's own services bind at random, so Ray starting up cannot take it first."""
    import random
    import socket

    for port in random.Random().sample(range(20_000, 32_000), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def perturbed_shipped_model(seed: int):
    """(checkpoint dir, SmolLM2 as shipped, SmolLM2 with every weight moved by 0.02 x N(0, 1)):
    new weights whose effect on generation is unmistakable, for the weight-update tests."""
    from slea.models import SHIPPED, load_model, resolve_checkpoint

    model, _tokenizer = load_model(SHIPPED)
    replacement, _ = load_model(SHIPPED)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in replacement.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return resolve_checkpoint(SHIPPED), model, replacement


def listening_addresses(port: int) -> set[str]:
    """The IPv4/IPv6 addresses a TCP socket on `port` listens on, from /proc/net/tcp{,6} (so a test
    can tell "loopback only" from "every interface" without sending anything off loopback)."""
    import ipaddress
    from pathlib import Path

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).is_file():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address_hex)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(raw)))
    return found
