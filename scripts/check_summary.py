"""summary.json of a GPU check (scripts/gpu_check.sh, scripts/device_check.sh; scripts/check_lib.sh
calls it): one JSON object, rewritten after every probe, so that a check stopped midway still
says how far it got. Standard library only: it runs before anything is installed.

    {"check": "device_check", "started": "2026-12-06T01:02:03Z", "deadline_s": 540,
     "environment": "environment.txt", "status": "running" | "passed" | "failed", "seconds": 312.4,
     "counts": {"passed": 3, "failed": 1, "timeout": 0, "skipped": 1},
     "probes": [{"name": "learner_step", "status": "passed" | "failed" | "timeout" | "skipped",
                 "seconds": 81.2, "timeout_s": 240, "log": "3-learner_step.log",
                 "figures": {...what the probe measured...},
                 "reason": "why it was skipped", "tail": "the end of its log, when it did not pass"}]}

usage: python3 check_summary.py start SUMMARY CHECK DEADLINE_S
       python3 check_summary.py add SUMMARY NAME STATUS STARTED_EPOCH TIMEOUT_S LOG FIGURES_JSON [REASON]
       python3 check_summary.py finish SUMMARY      (prints summary.json; exit status 0 when every probe passed)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

TAIL_LINES = 40  # of a probe's log that did not pass: the cause is usually in its last lines
TAIL_CHARS = 4000


def start(summary: Path, check: str, deadline_s: float) -> dict:
    state = {
        "check": check,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "started_epoch": time.time(),
        "deadline_s": float(deadline_s),
        "environment": "environment.txt",
        "status": "running",
        "probes": [],
    }
    _write(summary, state)
    return state


def add(
    summary: Path, name: str, status: str, started_epoch: float, timeout_s: float, log: str, figures: Path,
    reason: str = "",
) -> dict:  # fmt: skip
    """One probe's entry: its figures from the JSON file it wrote (if any), the end of its log unless it passed."""
    entry = {
        "name": name,
        "status": status,
        "seconds": round(time.time() - float(started_epoch), 1) if float(started_epoch) else 0.0,
        "timeout_s": float(timeout_s),
        "log": log or None,
    }
    if figures and Path(figures).is_file() and Path(figures).read_text().strip():
        try:
            entry["figures"] = json.loads(Path(figures).read_text())
        except json.JSONDecodeError as exc:
            entry["figures"] = {"unreadable": f"{figures}: {exc}"}
    if reason:
        entry["reason"] = reason
    log_path = summary.parent / log if log else None
    if status != "passed" and log_path is not None and log_path.is_file():
        lines = log_path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        entry["tail"] = "\n".join(lines)[-TAIL_CHARS:]
    state = json.loads(summary.read_text())
    state["probes"].append(entry)
    _write(summary, state)
    return entry


def finish(summary: Path) -> dict:
    state = json.loads(summary.read_text())
    statuses = [probe["status"] for probe in state["probes"]]
    state["counts"] = {status: statuses.count(status) for status in ("passed", "failed", "timeout", "skipped")}
    state["status"] = "passed" if statuses and set(statuses) == {"passed"} else "failed"
    if "started_epoch" in state:  # finished once already: keep its time
        state["seconds"] = round(time.time() - state.pop("started_epoch"), 1)
    _write(summary, state)
    return state


def _write(summary: Path, state: dict) -> None:
    staging = summary.with_suffix(".json.tmp")  # a reader never sees half a file
    staging.write_text(json.dumps(state, indent=1) + "\n")
    staging.replace(summary)


def main(argv: list[str]) -> int:
    command, summary, args = argv[0], Path(argv[1]), argv[2:]
    if command == "start":
        start(summary, *args)
    elif command == "add":
        add(summary, *args)
    elif command == "finish":
        state = finish(summary)
        print(summary.read_text(), end="")
        return 0 if state["status"] == "passed" else 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
