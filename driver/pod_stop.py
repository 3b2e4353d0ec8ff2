"""`slea pod-stop`: the preStop hook of a run's Ray pods (deploy/k8s/base/rayjob.yaml).

Deleting a Ray pod (the RayJob deleted or suspended, a node drained) makes the kubelet run the
pod's preStop hook and only then send SIGTERM to the container's PID 1. In a KubeRay pod PID 1
is `ray start --block` (bash execs the last command of KubeRay's `ulimit ...; ray start ...`),
and on SIGTERM it drains for at most RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (30 s) and then kills
the raylet and every worker process (ray/_private/node.py, `_register_shutdown_hooks`): the
driver never hears of it and the learner dies between checkpoints. KubeRay does not stop the
job first when it suspends a RayJob ("users need to set the Pod's preStop hook by themselves",
rayjob_controller.go at the CRDs' commit feeaf72, JobDeploymentStatusSuspending).

So the hook stops the run itself. In the container it runs in:
- every `slea train` driver gets SIGTERM, its graceful stop (driver/train.py `_shutdown`: the
  actors abandon their groups, the learner checkpoints, the library writer snapshots);
- the hook returns once no driver and none of slea's Ray actors it owns (SLEA_ACTOR_CLASSES) is left
  there. On a worker pod that keeps the learner and the library writer alive while the
  driver on the head still needs them to write; they go when the driver exits.
The wait is bounded by `timeout_s`, and the pod's terminationGracePeriodSeconds bounds it too.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil

# The classes slea runs as Ray actors, owned by the driver: they go when it exits. Ray titles an
# actor's worker process "ray::<Class>" or "ray::<Class>.<method>".
SLEA_ACTOR_CLASSES = ("ActorWorkerProcess", "LearnerProcess", "LibraryProcess", "PanelEvaluator", "RunControl")
# Detached (learner/weights.py): it lives as long as the Ray cluster, so the hook does not wait for
# it; a new cluster's learner publishes its checkpoint's weights again. tests/driver/test_pod_stop.py
# checks that the two lists together name every class the code runs as a Ray actor.
OUTLIVE_THE_DRIVER = ("WeightRegistry",)
POLL_S = 1.0


def is_driver(cmdline: list[str]) -> bool:
    """`<python> <venv>/bin/slea train ...`: the console script run by its interpreter (a shell
    that started it is not the driver, and a SIGTERM to it would not reach the driver)."""
    return len(cmdline) > 2 and Path(cmdline[1]).name == "slea" and cmdline[2] == "train"


def is_slea_actor(cmdline: list[str]) -> bool:
    title = " ".join(cmdline).strip()
    if not title.startswith("ray::"):
        return False
    return title[len("ray::") :].split(".", 1)[0].split(" ", 1)[0] in SLEA_ACTOR_CLASSES


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def run_processes(init_pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(drivers, slea actors) among `init_pid` and its descendants: in a container, PID 1's tree
    is the container."""
    drivers, actors = [], []
    try:
        init = psutil.Process(init_pid)
        tree = [init, *init.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [], []
    for process in tree:
        cmdline = _cmdline(process)
        if is_driver(cmdline):
            drivers.append(process)
        elif is_slea_actor(cmdline):
            actors.append(process)
    return drivers, actors


def stop_pod(timeout_s: float, init_pid: int = 1, say=print) -> int:
    """SIGTERM to the drivers under `init_pid`, then wait for them and slea's actors there to go.
    0 when they went, 1 when `timeout_s` passed first (the kubelet goes on with its SIGTERM
    either way)."""
    started = time.monotonic()
    drivers, actors = run_processes(init_pid)
    for driver in drivers:
        say(f"pod-stop: SIGTERM to the slea train driver (pid {driver.pid}): its graceful stop")
        try:
            driver.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    if actors:
        say(f"pod-stop: waiting for {len(actors)} slea actor(s) here to finish")
    while time.monotonic() - started < timeout_s:
        drivers, actors = run_processes(init_pid)
        if not drivers and not actors:
            say(f"pod-stop: the run stopped here after {time.monotonic() - started:.0f} s")
            return 0
        time.sleep(POLL_S)
    say(f"pod-stop: {len(drivers)} driver(s) and {len(actors)} actor(s) still here after {timeout_s:.0f} s")
    return 1
