"""`slea scale RUN --actors N`: resize the actor pool of a running `slea train`.

RUN is a run directory (its driver.json names the Ray cluster the driver joined) or a run id
(the cluster is `--address`, "auto" on a KubeRay head pod). The command joins that cluster,
finds the run's RunControl actor (driver/pool_control.py) and sets the desired size; the
driver's loop applies it within a poll. The learner and the library never notice.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

from slea.channels import RAY_NAMESPACE, run_control_name

PROBE_TIMEOUT_S = 3.0  # a stale driver.json's address: say so instead of waiting for Ray to give up


class ScaleError(Exception):
    """Why `slea scale` could not resize the run (the message says what to do)."""


def locate_run(run: str, address: str) -> tuple[str, str]:
    """(run id, Ray address) for RUN: a run directory's driver.json, or a run id and `address`."""
    from driver.pool_control import DRIVER_FILE

    path = Path(run)
    if not path.is_dir():
        if "/" in run or "\\" in run:
            raise ScaleError(f"no run directory {run}")
        return run, address
    driver_file = path / DRIVER_FILE
    if not driver_file.is_file():
        raise ScaleError(
            f"no run is going in {run}: it has no {DRIVER_FILE} (its slea train stopped, or never started)"
        )
    try:
        driver = json.loads(driver_file.read_text())
        return driver["run_id"], driver["ray_address"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ScaleError(f"{driver_file} is not a driver file slea train wrote ({exc!r})") from None


def probe(address: str, run_id: str) -> None:
    """Fail fast when nothing listens at a host:port Ray address (Ray itself retries for a minute)."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        raise ScaleError(
            f"no run '{run_id}' is going: nothing answers at its Ray address {address} ({exc.__class__.__name__})"
        ) from None


def scale_run(run: str, actors: int, address: str = "auto") -> str:
    """Ask the running driver of RUN for `actors` workers; returns the line to print."""
    run_id, address = locate_run(run, address)
    probe(address, run_id)
    import ray  # after the checks that need no cluster: their errors answer at once

    try:
        ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ScaleError(f"no run '{run_id}' is going: no Ray cluster at {address} ({exc})") from None
    try:
        try:
            control = ray.get_actor(run_control_name(run_id), namespace=RAY_NAMESPACE)
        except ValueError:
            raise ScaleError(f"no run '{run_id}' is going on the Ray cluster at {address}") from None
        result = ray.get(control.request.remote(actors))
    finally:
        ray.shutdown()
    if "error" in result:
        raise ScaleError(f"run '{run_id}': {result['error']}")
    previous, desired, alive = result["previous"], result["desired"], result["alive"]
    if previous == desired:
        return f"run {run_id}: actor pool already at {desired} workers ({alive} up); nothing changed"
    note = "; actors.autoscale resizes it from here" if result["autoscale"] else ""
    return f"run {run_id}: actor workers {previous} -> {desired} ({alive} up now; the driver applies it within seconds){note}"
