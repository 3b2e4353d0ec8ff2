"""Snapshots: the whole library as JSON Lines, one item per line, readable with `less` or `jq`.

Line 1 is a header (version, learner version, counters, and the episodes whose effects the
snapshot holds, which makes redelivered stream entries idempotent); then one line per cluster
(least recently used first, so restoring keeps the eviction order); then one line per
experience. Vectors are base64 float32, so a restored library answers exactly as before.
Files are written beside their final name and renamed, so a crash never leaves half a snapshot.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from library.clusters import Cluster
from library.experience import LEVELS, Experience
from library.state import Library

KEEP_SNAPSHOTS = 3  # older snapshots are deleted; the newest one is all a restart needs


def snapshot_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "library" / "snapshots"


def snapshot_text(library: Library, applied_episodes: list[str]) -> str:
    """The library (taken under its lock, so one version) as JSON Lines."""
    with library.lock:
        header = {
            "kind": "header",
            "version": library.version,
            "learner_version": library.learner_version,
            "next_id": library.next_id,
            "counters": dict(library.counters),
            "created_at": time.time(),
            "clusters": sum(len(space) for space in library.clusters.values()),
            "experiences": len(library.experiences),
            "applied_episodes": applied_episodes,
        }
        lines = [json.dumps(header)]
        for space in library.clusters.values():
            lines.extend(json.dumps({"kind": "cluster", **cluster.to_json()}) for cluster in space.by_id.values())
        lines.extend(
            json.dumps({"kind": "experience", **experience.to_json()}) for experience in library.experiences.values()
        )
    return "\n".join(lines) + "\n"


def parse_snapshot(text: str) -> tuple[dict, list[dict], list[dict]]:
    """JSON Lines -> (header, cluster records, experience records)."""
    header, clusters, experiences = None, [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        kind = record.pop("kind", None)
        if kind == "header":
            header = record
        elif kind == "cluster":
            clusters.append(record)
        elif kind == "experience":
            experiences.append(record)
        else:
            raise ValueError(f"snapshot line {number} has unknown kind {kind!r}")
    if header is None:
        raise ValueError("snapshot has no header line")
    return header, clusters, experiences


def load_snapshot_text(library: Library, text: str) -> dict:
    """Replace the library's state with a snapshot's; returns the header."""
    header, clusters, experiences = parse_snapshot(text)
    library.load(header, [Cluster.from_json(r) for r in clusters], [Experience.from_json(r) for r in experiences])
    return header


def write_snapshot(run_dir: str | Path, text: str, version: int) -> Path:
    folder = snapshot_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"v{version:09d}.jsonl"
    staging = path.with_suffix(".jsonl.tmp")
    with open(staging, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())  # acks follow this write: it must be on disk, not in the page cache
    staging.replace(path)
    for old in sorted(folder.glob("v*.jsonl"))[:-KEEP_SNAPSHOTS]:
        old.unlink()
    return path


def latest_snapshot(run_dir: str | Path) -> Path | None:
    found = sorted(snapshot_dir(run_dir).glob("v*.jsonl"))
    return found[-1] if found else None


def show_library(run_dir: str | Path, top: int = 3) -> str:
    """`slea library show RUN`: version, clusters, zones and levels with their best items."""
    path = latest_snapshot(run_dir)
    if path is None:
        return f"{run_dir}: no library snapshot yet (looked in {snapshot_dir(run_dir)})"
    return describe_snapshot(path.read_text(), f"library of {run_dir} (snapshot {path.name})", top)


def utility_label(item: dict) -> str:
    """An item's EDGE utility with the A/B sample behind it. Only A/B groups (`run.edge`) move a
    utility, so without them every item would read "utility +0.00", which looks like a measured
    zero; it reads "no A/B evidence" instead."""
    compared = item.get("compared", 0)
    if compared == 0:
        return "utility - (no A/B evidence)"
    return f"utility {item['utility']:+.2f} over {compared} A/B"


def describe_snapshot(text: str, title: str, top: int = 3) -> str:
    """A snapshot's version, clusters, zones and levels with their best `top` items and the
    episodes each was distilled from, under `title`."""
    header, clusters, experiences = parse_snapshot(text)
    per_task: dict[str, int] = {}
    for cluster in clusters:
        per_task[cluster["task_type"]] = per_task.get(cluster["task_type"], 0) + 1
    counters = ", ".join(f"{name} {count}" for name, count in header["counters"].items())
    lines = [
        title,
        f"version {header['version']}  learner version {header['learner_version']}  "
        f"experiences {len(experiences)}  clusters {len(clusters)}",
        "clusters per task type: "
        + (", ".join(f"{task} {count}" for task, count in sorted(per_task.items())) or "none"),
        f"counters: {counters}",
    ]
    for zone, levels in LEVELS.items():
        in_zone = [e for e in experiences if e["zone"] == zone]
        lines.append(f"{zone} zone: {len(in_zone)} items")
        for level in levels:
            items = sorted((e for e in in_zone if e["level"] == level), key=lambda e: -(e["score"] + e["utility"]))
            lines.append(f"  {level}: {len(items)}")
            for item in items[:top]:
                lines.append(
                    f"    [{item['id']}] score {item['score']:.2f} {utility_label(item)} "
                    f"used {item['usage']}x  {item['text'][:100]}"
                )
                lines.append(f"      from episodes: {', '.join(item['source_episode_ids']) or '(none recorded)'}")
    return "\n".join(lines)
