"""Where slea keeps what it builds once and reuses, in two roots.

- The build cache (`SLEA_CACHE_DIR`, else ~/.cache/slea-rl): converted model checkpoints. The images
  fill it when they are built and only read it at run time, so on a pod it may sit on the
  read-only root filesystem.
- The run-time cache (`SLEA_RUNTIME_CACHE_DIR`, else the build cache): what the envs write while a
  run plays, compiled TextWorld games and ALFWorld's solvability verdicts. The images point it at
  /tmp/slea-cache, the emptyDir every pod mounts (tests/deploy/test_pod_security.py ties the two).

On a developer's machine neither variable is set and both are ~/.cache/slea-rl.
"""

from __future__ import annotations

import os
from pathlib import Path


def build_cache_dir() -> Path:
    return Path(os.environ.get("SLEA_CACHE_DIR") or Path.home() / ".cache" / "slea-rl")


def runtime_cache_dir() -> Path:
    runtime = os.environ.get("SLEA_RUNTIME_CACHE_DIR")
    return Path(runtime) if runtime else build_cache_dir()
