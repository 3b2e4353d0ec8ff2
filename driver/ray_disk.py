"""Whether the disk under Ray's temp dir has room, said before Ray starts rather than after.

A raylet stops creating objects once the disk holding its session directory is fuller than
`local_fs_capacity_threshold` (95% by default, RAY_local_fs_capacity_threshold): available space
at or below (1 - threshold) x capacity (ray/src/ray/common/file_system_monitor.cc). What fails then
is far from the cause: a CI run on a shared 252 GB disk with 1 GB left errored in 11 tests, and
only a raylet event log said "over 95% full". A local `slea train`, `slea doctor` and the test
suite ask here first and name the directory, the space and Ray's rule.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

THRESHOLD_VARIABLE = "RAY_local_fs_capacity_threshold"
RAY_DEFAULT_THRESHOLD = 0.95
GIB = 1 << 30


class DiskTooFull(RuntimeError):
    """The disk under Ray's temp dir is past (or within `spare` of) Ray's capacity threshold."""


@dataclass
class DiskRoom:
    """Space on the filesystem that holds `path`, as Ray's file-system monitor reads it."""

    path: str
    free_bytes: int  # available to an unprivileged writer (statvfs f_bavail, std::filesystem::space)
    total_bytes: int  # the filesystem's capacity
    threshold: float  # fraction of capacity in use past which Ray refuses new objects

    @property
    def room_bytes(self) -> int:
        """Bytes that can still be written before Ray calls the disk full (negative: past it)."""
        return self.free_bytes - int((1 - self.threshold) * self.total_bytes)

    def describe(self) -> str:
        return (
            f"{self.path}: {self.free_bytes / GIB:.1f} GiB free of {self.total_bytes / GIB:.0f} GiB; Ray refuses "
            f"new objects once less than {(1 - self.threshold):.0%} of the disk is free ({THRESHOLD_VARIABLE}="
            f"{self.threshold:g}), {self.room_bytes / GIB:.1f} GiB from here"
        )


def ray_temp_dir() -> str:
    """Where a Ray started by this process keeps its sessions: RAY_TMPDIR, else the system temp dir."""
    return os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()


def disk_room(path: str | None = None) -> DiskRoom:
    path = path or ray_temp_dir()
    usage = shutil.disk_usage(path)
    threshold = float(os.environ.get(THRESHOLD_VARIABLE, RAY_DEFAULT_THRESHOLD))
    return DiskRoom(path, usage.free, usage.total, threshold)


def require_disk_room(spare_bytes: int = 0, path: str | None = None) -> DiskRoom:
    """The room under Ray's temp dir, or DiskTooFull when less than `spare_bytes` is left before Ray's line."""
    room = disk_room(path)
    if room.room_bytes < spare_bytes:
        needed = f" and this needs {spare_bytes / GIB:.1f} GiB of it" if spare_bytes else ""
        raise DiskTooFull(f"not enough disk for Ray: {room.describe()}{needed}; free some space on that disk")
    return room
