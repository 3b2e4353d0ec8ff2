"""Helpers shared by several test modules (importable as `helpers`: pytest puts tests/ on the path)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from slea.records import decode
from slea.streams import PAYLOAD_FIELD


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


def entry_key(entry_id: str) -> tuple[int, int]:
    millis, seq = entry_id.split("-")
    return int(millis), int(seq)


def learner_metrics(run_dir) -> list[dict]:
    """The learner's own per-step log (<run dir>/learner/metrics.jsonl), across restarts."""
    path = Path(run_dir) / "learner" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def lineage(trace: list[dict]) -> list[dict]:
    """The learner steps whose updates survived: a restart from a checkpoint at step c writes step
    c+1 again, which rolls back every line of a step > c before it (those updates died unsaved).
    A `restored` line (a new version for the checkpoint's weights) trains nothing and is left out."""
    kept: list[dict] = []
    for line in trace:
        if line.get("restored"):
            continue
        kept = [earlier for earlier in kept if earlier["learner_step"] < line["learner_step"]]
        kept.append(line)
    return kept


def check_the_counts(run_dir, config, client) -> None:
    """After a run that was broken on purpose: the version line, each finished episode trained on at
    most once, nothing acknowledged without a durable effect (tests/test_fault_tolerance.py,
    tests/test_cluster_resume.py)."""
    stream = config.stream_key()
    learner_dir = Path(run_dir) / "learner"
    records = {entry_id.decode(): decode(fields[PAYLOAD_FIELD]) for entry_id, fields in client.xrange(stream)}
    trace = [json.loads(line) for line in (learner_dir / "trained_groups.jsonl").read_text().splitlines()]

    # The version line: no version is skipped and it never goes back, across the restart. A number
    # shows twice only when the crash lost an update before it was recorded (by the registry, or in
    # Redis): the restarted learner then publishes that number for the first time (had it been
    # recorded, the new learner would have continued after it). A learner on a new Ray cluster
    # announces its checkpoint's weights under the next number (a `restored` line).
    versions = [line["policy_version"] for line in trace]
    assert versions == sorted(versions), versions
    assert sorted(set(versions)) == list(range(versions[0], versions[-1] + 1)), versions
    assert max(versions.count(version) for version in versions) <= 2, versions

    # Each finished episode trained on at most once by the surviving policy; never an abandoned one.
    kept = lineage(trace)
    trained = [group_id for line in kept for group_id in line["group_ids"]]
    assert len(trained) == len(set(trained)), "a group was trained on twice"
    steps = defaultdict(dict)  # group id -> episode id -> {step index: record}
    for record in records.values():
        if not record.abandoned:
            steps[record.group_id].setdefault(record.episode_id, {})[record.step] = record
    complete = {
        (group_id, episode_id)
        for group_id, episodes in steps.items()
        for episode_id, held in episodes.items()
        if sorted(held) == list(range(len(held))) and held[len(held) - 1].done
    }
    abandoned = {record.group_id for record in records.values() if record.abandoned}
    cut_short = {
        record.group_id
        for record in records.values()
        if record.abandoned and (record.group_id, record.episode_id) not in complete
    }
    assert cut_short and not cut_short & set(trained), "an abandoned episode was trained on"
    for group_id in trained:
        assert {(group_id, episode_id) for episode_id in steps[group_id]} <= complete
        assert len(steps[group_id]) == config.actors.group_size
    # Updates rolled back by the crash were redone from the re-read pending entries.
    rolled_back = {group_id for line in trace if line not in kept for group_id in line["group_ids"]}
    assert rolled_back and rolled_back <= set(trained)

    # The final checkpoint holds exactly the surviving steps.
    checkpoints = learner_dir / "checkpoints"
    state = json.loads((checkpoints / (checkpoints / "latest").read_text().strip() / "state.json").read_text())
    assert (state["learner_step"], state["version"]) == (kept[-1]["learner_step"], kept[-1]["policy_version"])

    # Nothing acknowledged without a durable effect: an acked entry belongs to a checkpointed group or
    # to a deliberately dropped (abandoned) one, and every trained group's entries are acked.
    info = {group["name"].decode(): group for group in client.xinfo_groups(stream)}
    delivered_up_to = entry_key(info["learner"]["last-delivered-id"].decode())
    pending = {entry["message_id"].decode() for entry in client.xpending_range(stream, "learner", "-", "+", 100_000)}
    acked = {entry_id for entry_id in records if entry_key(entry_id) <= delivered_up_to and entry_id not in pending}
    assert {records[entry_id].group_id for entry_id in acked} <= set(trained) | abandoned
    assert all(entry_id in acked for entry_id, record in records.items() if record.group_id in set(trained))

    # The learner counted its drops: abandoned groups, and nothing dropped for any other reason.
    metrics = learner_metrics(run_dir)
    assert max(line["groups_dropped_abandoned"] for line in metrics) > 0
    assert all(line["groups_dropped_stale"] == line["groups_dropped_incomplete"] == 0 for line in metrics)
