"""`slea train` end to end on one machine: real Ray, Redis, Serve, DeepSpeed and a tiny model."""

import socket
import subprocess
import sys
import time

import pytest
from helpers import is_loopback, listening_sockets
from wandb_offline import offline_run

from driver.run_outputs import read_metrics

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)
SLEA = [sys.executable, "-m", "driver.cli"]


# What a normal run must not show (issue 39): Ray's token-authentication WARNING at ray.init, the
# "(raylet) Task ServeController.graceful_shutdown failed" that serve.shutdown() leaves, DeepSpeed's
# "[WARNING] ... Setting accelerator to CPU" when the driver imported it at the summary.
NOISE = ("WARNING", "(raylet)", "Setting accelerator")


def train(*args: str, timeout: int = 600) -> set[tuple[str, int, str]]:
    """Run `slea train` to its end; returns every TCP socket its processes listened on (looked
    at about once a second: Ray's servers and the learner's listen for the whole run). Its output
    holds no line of NOISE."""
    process = subprocess.Popen([*SLEA, "train", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, listeners = time.monotonic() + timeout, set()
    while True:
        try:
            out, err = process.communicate(timeout=1.0)
            break
        except subprocess.TimeoutExpired:  # still running: retrying communicate loses no output
            listeners |= listening_sockets(process.pid)
            if time.monotonic() > deadline:
                process.kill()
                raise
    assert process.returncode == 0, err[-3000:]
    noise = [line for line in (out + err).splitlines() if any(word in line for word in NOISE)]
    assert not noise, "a normal run shows:\n" + "\n".join(noise)
    return listeners


def test_train_writes_a_complete_run_and_resume_continues_the_version_line(tmp_path, tiny_model_dir, monkeypatch):
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # wandb's home files: the test's own
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
    listeners = train(
        "configs/local.yaml",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "run.id=e2e",
        "--set",
        f"model.name={tiny_model_dir}",
        "--set",
        "model.max_new_tokens=8",
        "--set",
        "learner.max_steps=3",
        "--set",
        "learner.checkpoint_every=2",
        "--set",
        "envs.max_steps=3",
        "--set",
        "envs.panel_size=4",
        "--set",
        "actors.group_size=2",
        "--set",
        "learner.tasks_per_step=1",
        "--set",
        "library.snapshot_every=1",
        "--set",
        "eval.every=2",
        "--set",
        "eval.before_training=true",  # the whole evaluation path (configs/local.yaml trades both away for speed)
        "--set",
        "eval.policy_alone=true",
        "--set",
        "eval.panel_size=2",
        "--set",
        "eval.samples_per_task=1",
        "--set",
        "monitoring.sinks=[jsonl, tensorboard, wandb]",
        "--set",
        "monitoring.wandb_mode=offline",  # no network: the W&B run stays in runs/e2e/wandb/ for `wandb sync`
    )
    # Closed by default (issue 22; docs/configuration.md): the local Ray's servers, the learner's and
    # the library's listen on loopback only. Not ours to place: gloo's pair sockets bind the address
    # the host name resolves to, and Ray Serve 2.60 binds each replica's inter-deployment gRPC server
    # to [::] (ray/serve/_private/replica.py), behind Ray's token authentication.
    gloo_address = socket.gethostbyname(socket.gethostname())
    open_beyond = {
        (address, port, name)
        for address, port, name in listeners
        if not is_loopback(address)
        and address != gloo_address
        and not (address == "::" and name.startswith("ray::ServeReplica"))
    }
    assert any(name == "gcs_server" for _address, _port, name in listeners), f"Ray not seen: {sorted(listeners)}"
    assert not open_beyond, f"listening beyond 127.0.0.1: {sorted(open_beyond)}"
    run_dir = tmp_path / "e2e"
    for part in (
        "config.yaml",
        "metrics.jsonl",
        "tensorboard",
        "plots/success_rate.png",
        "plots/stream_lag.png",
        "plots/library_size.png",
        "plots/eval_success.png",
        "learner/checkpoints/latest",
        "library/snapshots",
        "redis",
    ):
        assert (run_dir / part).exists(), f"run directory lacks {part}"
    assert list((run_dir / "tensorboard").iterdir()), "no TensorBoard event file"
    steps = [line for line in read_metrics(run_dir) if "learner/policy_version" in line]
    assert [line["learner/policy_version"] for line in steps] == [1, 2, 3]
    assert all("actors/success_rate" in line and "stream/lag/learner" in line for line in steps)
    # Held-out evaluations: before the first update and after the last, and at step 2 unless the
    # step-3 request replaced it while step 0's evaluation still ran; each with its report.
    evaluated = {line["step"]: line for line in read_metrics(run_dir) if "eval/success_rate" in line}
    assert {0, 3} <= set(evaluated) <= {0, 2, 3}
    assert evaluated[0]["eval/policy_version"] == 0 and evaluated[3]["eval/policy_version"] == 3
    assert (
        "eval/sampled/library/success_rate" in evaluated[3] and "eval/sampled/no_library/success_rate" in evaluated[3]
    )
    assert len(list((run_dir / "eval").glob("step-*/report.json"))) == len(evaluated)
    # the evaluations after an update played with the library and list what it held beside the report
    [listing] = (run_dir / "eval").glob("step-00003-*/library.md")
    assert "library of" in listing.read_text() and "strategy zone:" in listing.read_text()
    assert not list((run_dir / "eval").glob("step-00000-*/library.md"))  # step 0 plays without it
    assert all(f"library/prompts/{what}" in steps[-1] for what in ("seen", "strategy", "warning"))

    [first_log] = offline_logs(run_dir)
    assert wandb_versions(first_log) == [1, 2, 3]

    train("--resume", str(run_dir), "--set", "learner.max_steps=5")
    steps = [line for line in read_metrics(run_dir) if "learner/policy_version" in line]
    assert [line["learner/policy_version"] for line in steps] == [1, 2, 3, 4, 5]  # no gap, no repeat
    latest = (run_dir / "learner/checkpoints/latest").read_text().strip()
    assert latest.endswith("5")
    first, resumed = offline_logs(run_dir)  # the resumed start continues the same W&B run
    assert offline_run(first)[0].run_id == offline_run(resumed)[0].run_id
    assert wandb_versions(resumed) == [4, 5]


def offline_logs(run_dir):
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"), key=lambda path: path.parent.name)


def wandb_versions(log) -> list[int]:
    """The policy versions of the learner steps a W&B run log holds."""
    return [row["learner/policy_version"] for row in offline_run(log)[2] if "learner/policy_version" in row]


def test_a_second_run_with_the_same_id_is_refused(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.yaml").write_text("{}")
    result = subprocess.run(
        [*SLEA, "train", "configs/local.yaml", "--set", f"run.dir={tmp_path}", "--set", "run.id=taken"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "--resume" in result.stderr.strip().splitlines()[-1]
