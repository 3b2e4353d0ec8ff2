"""`slea pod-stop`, the Ray pods' preStop hook (driver/pod_stop.py): which processes it stops and
waits for, tried on real processes under a parent of the test's (a container's PID 1 stands in)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from driver.pod_stop import OUTLIVE_THE_DRIVER, SLEA_ACTOR_CLASSES, is_driver, is_slea_actor, stop_pod

REPO = Path(__file__).resolve().parents[2]


def _ray_actor_classes() -> set[str]:
    """Every class the code decorates with @ray.remote(...) or @ray.remote."""
    found = set()
    for package in ("actors", "learner", "library", "driver", "slea"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    "ray.remote" in ast.unparse(decorator) for decorator in node.decorator_list
                ):
                    found.add(node.name)
    return found


def test_the_hook_knows_every_class_slea_runs_as_a_ray_actor():
    assert set(SLEA_ACTOR_CLASSES) | set(OUTLIVE_THE_DRIVER) == _ray_actor_classes()


def test_what_counts_as_the_driver_and_as_slea_actors():
    assert is_driver(["/app/.venv/bin/python", "/app/.venv/bin/slea", "train", "/app/configs/cluster.yaml"])
    assert not is_driver(["/bin/sh", "-c", "slea train /app/configs/cluster.yaml"])  # the shell Ray started it with
    assert not is_driver(["/app/.venv/bin/python", "/app/.venv/bin/slea", "eval", "runs/x"])
    assert not is_driver(["ray", "job", "submit", "--", "slea", "train"])
    assert is_slea_actor(["ray::LearnerProcess.run", "", ""])  # Ray pads the rewritten title
    assert is_slea_actor(["ray::ActorWorkerProcess"])
    assert not is_slea_actor(["ray::IDLE"])
    assert not is_slea_actor(["ray::JobSupervisor"])
    assert not is_slea_actor(["ray::WeightRegistry"])  # detached: it outlives every driver
    assert not is_slea_actor(["/usr/bin/python", "ray::LearnerProcess"])


DRIVER = """
import signal, sys, time
from pathlib import Path
def stop(*_):
    time.sleep(1.5)  # its graceful stop takes a while
    Path(sys.argv[2]).write_text("stopped gracefully")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("up", flush=True)
time.sleep(60)
"""


def test_the_hook_stops_the_driver_gracefully_and_waits_for_the_actors(tmp_path):
    """A `slea train` driver (a script of that name: the hook reads command lines) that needs
    1.5 s for its stop, and an actor process titled as Ray titles a learner: the hook returns
    after both went, and the driver's stop ran to its end."""
    script = tmp_path / "slea"
    script.write_text(textwrap.dedent(DRIVER))
    marker = tmp_path / "marker"
    container = subprocess.Popen(  # the container's PID 1: the hook looks at its tree only
        [
            "bash",
            "-c",
            f'"{sys.executable}" "{script}" train "{marker}" & (exec -a "ray::LearnerProcess.run" sleep 4) & wait',
        ],
        start_new_session=True,
    )
    try:
        time.sleep(1.0)
        started = time.monotonic()
        assert stop_pod(timeout_s=30, init_pid=container.pid, say=lambda _: None) == 0
        took = time.monotonic() - started
        assert marker.read_text() == "stopped gracefully"
        assert took >= 2.0, f"returned after {took:.1f} s, before the learner (4 s) went"
    finally:
        os.killpg(container.pid, signal.SIGKILL)
        container.wait()


def test_the_hook_gives_up_after_its_timeout(tmp_path):
    container = subprocess.Popen(
        ["bash", "-c", '(exec -a "ray::LibraryProcess" sleep 30) & wait'], start_new_session=True
    )
    try:
        time.sleep(0.5)
        assert stop_pod(timeout_s=1.5, init_pid=container.pid, say=lambda _: None) == 1
    finally:
        os.killpg(container.pid, signal.SIGKILL)
        container.wait()
