"""Stream housekeeping: per-group lag and pending counts, trimming that never loses data, and a
finished run's keys expiring from a shared Redis.

Redis 7 has no "trim what every group acknowledged" (XTRIM ... ACKED is Redis 8.2), so the
safe MINID is computed from XINFO GROUPS and XPENDING: for each group, the oldest entry it
still holds pending, or else the entry after the last one delivered to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from monitoring.metrics import metric


@dataclass
class GroupStats:
    """Progress of one consumer group on the stream."""

    name: str  # consumer group name ("learner", "library")
    consumers: int  # consumers registered in the group
    pending: int  # delivered, not acknowledged
    lag: int  # entries not yet delivered to the group
    last_delivered_id: str  # last entry delivered to any consumer of the group


def _parse_id(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    return int(millis), int(seq or 0)


def _next_id(entry_id: str) -> str:
    millis, seq = _parse_id(entry_id)
    return f"{millis}-{seq + 1}"


def group_stats(client: redis.Redis, stream: str) -> dict[str, GroupStats]:
    """XINFO GROUPS as dataclasses; lag falls back to counting when Redis reports it unknown."""
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream yet
        return {}
    stats = {}
    for info in groups:
        name = info["name"].decode()
        last = info["last-delivered-id"].decode()
        lag = info.get("lag")
        if lag is None:  # Redis cannot tell after deletions in the middle: count what is after `last`
            lag = len(client.xrange(stream, min=_next_id(last), max="+"))
        stats[name] = GroupStats(name, int(info["consumers"]), int(info["pending"]), int(lag), last)
        metric("stream_lag").labels(stream=stream, group=name).set(lag)
        metric("stream_pending").labels(stream=stream, group=name).set(info["pending"])
    return stats


def safe_min_id(client: redis.Redis, stream: str, required_groups: list[str]) -> str | None:
    """The smallest id any group still needs; None when a required group does not exist yet
    (its entries would be lost) or no group exists. Every group counts, required or not (an
    operator's reader loses nothing), so a group nobody reads holds trimming back for good: a run
    creates only the groups it reads (slea/services.py stream_groups)."""
    stats = group_stats(client, stream)
    if not stats or any(group not in stats for group in required_groups):
        return None
    needed = []
    for group in stats.values():
        # Pending count and oldest pending id from one XPENDING (atomic): XINFO's count can be stale by
        # now (a consumer acked in between, leaving no oldest id). Without pending entries the group
        # needs what comes after the last delivery XINFO saw, which is never later than the current one.
        summary = client.xpending(stream, group.name)
        if summary["pending"]:
            needed.append(summary["min"].decode() if isinstance(summary["min"], bytes) else summary["min"])
        else:
            needed.append(_next_id(group.last_delivered_id))
    return min(needed, key=_parse_id)


def trim_acknowledged(client: redis.Redis, stream: str, required_groups: list[str]) -> int:
    """Delete entries every group has acknowledged; returns how many were removed."""
    min_id = safe_min_id(client, stream, required_groups)
    if min_id is None:
        return 0
    removed = client.xtrim(stream, minid=min_id, approximate=False)
    metric("stream_trimmed_total").labels(stream=stream).inc(removed)
    metric("stream_length").labels(stream=stream).set(client.xlen(stream))
    return removed


def _run_pattern(run_id: str) -> str:
    """SCAN pattern of every key of the run (slea:<run id>:...), with glob characters in the id escaped."""
    escaped = "".join(f"\\{char}" if char in "*?[]\\" else char for char in run_id)
    return f"slea:{escaped}:*"


def run_keys(client: redis.Redis, run_id: str) -> list[bytes]:
    """Every key of the run: its stream, dead letters, library state, version record, in-flight hashes."""
    return list(client.scan_iter(match=_run_pattern(run_id), count=1000))


def expire_run(client: redis.Redis, run_id: str, seconds: int) -> int:
    """Let the run's keys expire `seconds` from now (a shared Redis with `noeviction` never drops them
    otherwise); returns how many. A live driver sets it again and again (driver/retention.py)."""
    return _on_run_keys(client, run_id, lambda pipe, key: pipe.expire(key, seconds))


def _on_run_keys(client: redis.Redis, run_id: str, command) -> int:
    """`command(pipeline, key)` for every key of the run, in one round trip; returns how many keys."""
    keys = run_keys(client, run_id)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        command(pipe, key)
    pipe.execute()
    return len(keys)
