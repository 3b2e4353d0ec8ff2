"""Helpers shared by several test modules (importable as `helpers`: pytest puts tests/ on the path)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch
from ray._private.services import get_node_ip_address
from ray.cluster_utils import AutoscalingCluster

from driver.local_ray import LOOPBACK_SWITCH
from slea.ports import free_port
from slea.records import decode
from slea.streams import PAYLOAD_FIELD


def tiny_run(run_dir, run_id: str, model_dir) -> list[str]:
    """The `--set` settings every whole-run test starts from: configs/local.yaml played by the tiny
    model, 3-step episodes, groups of 2 on 2 envs a worker, a 4-task panel; each test adds what it
    is about (workers, checkpoints, resources, sinks)."""
    return [
        f"run.dir={run_dir}",
        f"run.id={run_id}",
        f"model.name={model_dir}",
        "model.max_new_tokens=8",
        "envs.max_steps=3",
        "envs.panel_size=4",
        "actors.envs_per_worker=2",
        "actors.group_size=2",
    ]


def broken_run(run_dir, run_id: str, model_dir, redis_url: str, ray_address: str) -> list[str]:
    """tiny_run() on a Redis and a Ray cluster the test started, as the tests that break a run on
    purpose drive `slea train` (tests/test_cluster_resume.py, tests/test_chaos.py): 2 actor workers,
    one group a learner step, staleness bounds out of the way, a snapshot every library version, no
    evaluation; each test adds its checkpoints and steps."""
    return [
        *tiny_run(run_dir, run_id, model_dir),
        f"redis.url={redis_url}",
        f"ray.address={ray_address}",
        "actors.num_workers=2",
        "actors.num_cpus=0.5",
        "actors.max_staleness=1000",
        "learner.tasks_per_step=1",
        "learner.num_cpus=1",
        "learner.max_staleness=1000",
        "library.snapshot_every=1",
        "library.http_port=0",
        "eval.every=0",
        "monitoring.sinks=[jsonl]",
        "monitoring.plots=false",
    ]


class FixedEngine:
    """A generation engine that answers every prompt with the same FrozenLake move; remembers the prompts it saw."""

    policy_version = 3
    name = "fixed"

    def __init__(self):
        from slea.models import shipped_tokenizer

        self.tokenizer = shipped_tokenizer()
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids):
        from actors.engines.base import Generation

        self.prompts.append(list(prompt_ids))
        response = np.asarray(self.tokenizer.encode("<action>right</action>"), dtype=np.int32)
        return Generation(
            list(prompt_ids), response, np.full(len(response), -0.5, np.float32), "<action>right</action>", 3, "stop"
        )


def fill_redis(client) -> None:
    """Put the server over its maxmemory (set below what it uses) with noeviction: every write is refused
    with OOM until `client.config_set("maxmemory", 0)`."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", client.info("memory")["used_memory"] // 2)


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


def listening_sockets(pid: int) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket the process `pid` and its descendants
    (a local Ray's GCS, raylet and workers descend from the driver that started it) listen on."""
    root = psutil.Process(pid)
    found = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            found |= {
                (conn.laddr.ip, conn.laddr.port, process.name())
                for conn in process.net_connections(kind="tcp")
                if conn.status == psutil.CONN_LISTEN
            }
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended between the listing and the look
            continue
    return found


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1, also written IPv4-mapped (::ffff:127.0.0.1, as a dual-stack socket shows it)."""
    import ipaddress

    parsed = ipaddress.ip_address(address)
    return parsed.is_loopback or (
        parsed.version == 6 and parsed.ipv4_mapped is not None and parsed.ipv4_mapped.is_loopback
    )


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable (milliseconds, sequence) pair."""
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


@dataclass
class StreamAudit:
    """What audit_the_stream() found, for the checks particular to one test."""

    trace: list[dict]  # the learner's trained_groups.jsonl, one line per step (restarts included)
    trained: set[str]  # group ids the surviving policy trained on
    abandoned: set[str]  # group ids with an abandon marker
    cut_short: set[str]  # group ids with an episode marked abandoned before it completed
    rolled_back: set[str]  # group ids of updates a learner crash lost (they must be trained again)


def audit_the_stream(
    records: dict, client, stream: str, learner_dir: Path, group_size: int, lost: frozenset[str] = frozenset()
) -> StreamAudit:
    """The counts that must add up after a run, however it was disturbed: `records` is every entry the
    stream held (entry id -> StepRecord; trimmed ones too, when the caller read them as they came),
    `learner_dir` the run's learner/ directory, `lost` the entries a Redis crash lost after it had
    accepted them (their groups may be dropped unacknowledged by anyone: nothing is left to ack).

    The version line has no gap and never goes back; each finished episode is trained on at most
    once by the surviving policy and never an abandoned one; every trained group is complete; the
    final checkpoint holds exactly the surviving steps; nothing is acknowledged without its effect
    being durable."""
    trace = [json.loads(line) for line in (learner_dir / "trained_groups.jsonl").read_text().splitlines()]

    # A number shows twice only when a crash lost an update before it was recorded (by the registry,
    # or in Redis): the restarted learner then publishes that number for the first time (had it been
    # recorded, the new learner would have continued after it). A learner on a new Ray cluster
    # announces its checkpoint's weights under the next number (a `restored` line).
    versions = [line["policy_version"] for line in trace]
    assert versions == sorted(versions), versions
    assert sorted(set(versions)) == list(range(versions[0], versions[-1] + 1)), versions
    assert max(versions.count(version) for version in versions) <= 2, versions

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
    assert not cut_short & set(trained), "an abandoned episode was trained on"
    for group_id in trained:
        assert {(group_id, episode_id) for episode_id in steps[group_id]} <= complete
        assert len(steps[group_id]) == group_size
    # Every episode is complete or marked abandoned: none can pass for complete when it is not.
    accounted = complete | {(record.group_id, record.episode_id) for record in records.values() if record.abandoned}
    for group_id, episodes in steps.items():
        for episode_id in episodes:
            assert (group_id, episode_id) in accounted, f"episode {episode_id} is neither complete nor abandoned"
    rolled_back = {group_id for line in trace if line not in kept for group_id in line["group_ids"]}

    # The final checkpoint holds exactly the surviving steps.
    checkpoints = learner_dir / "checkpoints"
    state = json.loads((checkpoints / (checkpoints / "latest").read_text().strip() / "state.json").read_text())
    assert (state["learner_step"], state["version"]) == (kept[-1]["learner_step"], kept[-1]["policy_version"])

    # An acked entry belongs to a checkpointed group or to a deliberately dropped (abandoned) one, and
    # every trained group's entries are acked.
    info = {group["name"].decode(): group for group in client.xinfo_groups(stream)}
    delivered_up_to = entry_key(info["learner"]["last-delivered-id"].decode())
    pending = {entry["message_id"].decode() for entry in client.xpending_range(stream, "learner", "-", "+", 100_000)}
    acked = {
        entry_id
        for entry_id in records
        if entry_id not in lost and entry_key(entry_id) <= delivered_up_to and entry_id not in pending
    }
    lost_groups = {records[entry_id].group_id for entry_id in lost}
    assert {records[entry_id].group_id for entry_id in acked} <= set(trained) | abandoned | lost_groups
    # (An abandon marker can come after its group was trained: a listing in flight whose HDEL a Redis
    # crash undid is marked abandoned when its worker stops. Written after the learner's last read,
    # it was never delivered; read, it is acknowledged as a late step of a closed group.)
    unacked = [
        (entry_id, record.group_id, record.episode_id, record.step, entry_id in pending)
        for entry_id, record in records.items()
        if record.group_id in set(trained)
        and entry_id not in lost
        and entry_id not in acked
        and not (record.abandoned and entry_key(entry_id) > delivered_up_to)
    ]
    assert not unacked, f"entries of trained groups not acknowledged (id, group, episode, step, pending): {unacked}"
    return StreamAudit(trace, set(trained), abandoned, cut_short, rolled_back)


def check_a_broken_run(run_dir, config, client) -> StreamAudit:
    """After a run broken on purpose (components killed mid-episode, a learner lost between
    checkpoints; tests/test_cluster_resume.py): the audit of the whole
    stream, and the marks the breakage must have left: episodes cut short and dropped as abandoned,
    updates rolled back and trained again, no group dropped for any other reason."""
    stream = config.stream_key()
    records = {entry_id.decode(): decode(fields[PAYLOAD_FIELD]) for entry_id, fields in client.xrange(stream)}
    audit = audit_the_stream(records, client, stream, Path(run_dir) / "learner", config.actors.group_size)
    assert audit.cut_short, "no episode was cut short: the breakage did not happen mid-episode"
    assert audit.rolled_back and audit.rolled_back <= audit.trained, "lost updates were not trained again"
    metrics = learner_metrics(run_dir)
    assert max(line["groups_dropped_abandoned"] for line in metrics) > 0
    assert all(line["groups_dropped_stale"] == line["groups_dropped_incomplete"] == 0 for line in metrics)
    return audit


def trained_trace(run_dir) -> list[dict]:
    """The learner's trace (<run dir>/learner/trained_groups.jsonl, one line per step it published,
    restarts included); empty before the first step."""
    path = Path(run_dir) / "learner" / "trained_groups.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def trained_steps(run_dir) -> list[dict]:
    """trained_trace() without its `restored` lines, which train nothing (a learner announcing its
    checkpoint's weights under a new version number, learner/learner.py `_trace`): the steps trained."""
    return [line for line in trained_trace(run_dir) if not line.get("restored")]


def output_tail(path: Path, chars: int = 3000) -> str:
    """The end of a subprocess's captured output, for a failure message."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


def start_train(cluster: TaggedRay, settings: list[str], log: Path) -> subprocess.Popen:
    """`slea train configs/local.yaml` with `settings` on the test's Ray cluster (its environment),
    stdout and stderr into `log`; the caller waits for it, or kills it."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "driver.cli", "train", "configs/local.yaml", *(f"--set={s}" for s in settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.env,
        )


def token_ray() -> TaggedRay:
    """A TaggedRay with Ray token authentication, as on KubeRay (deploy/k8s): explicit, so a test does
    not depend on whether this machine holds a ~/.ray/auth_token (`ray start` turns auth on when it
    does, and a driver must then present the same token)."""
    return TaggedRay(
        {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
        }
    )


class TaggedRay:
    """Ray processes one test starts (`ray start`), and only those: every process of the cluster,
    the workers Ray forks included, carries `SLEA_TEST_CLUSTER=<marker>` in its environment, so the
    test can signal and stop exactly them (never `ray stop`, which ends every Ray on the machine).
    Each cluster gets a temp dir of its own, `<root>/ray` with a short root under /tmp (Ray's socket
    paths must fit 107 bytes), not the shared /tmp/ray; with RAY_TMPDIR=<root>, `ray.init("auto")`
    finds that cluster (its address file is there) and no other."""

    def __init__(self, env: dict | None = None):
        self.marker = f"slea-test-{uuid.uuid4().hex}"
        bin_dir = os.path.dirname(sys.executable)  # the venv's `ray`, for `ray start` and its workers
        base = dict(os.environ if env is None else env)
        # A cluster stands for one of many machines: it takes Ray's own node address, the one this
        # process's Ray computes for `address`, never the loopback switch a `slea train` called
        # in-process leaves in os.environ (driver/local_ray.py).
        base.pop(LOOPBACK_SWITCH, None)
        self.env = {**base, "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}", "SLEA_TEST_CLUSTER": self.marker}
        self.roots: list[str] = []  # one per cluster started: RAY_TMPDIR for a driver joining it by "auto"
        self.address: str | None = None

    def start_head(self, *args: str, env: dict | None = None, port: int | None = None) -> str:
        """`ray start --head ARGS` on `port` (default: a free one) and a new temp dir; returns the
        GCS address. `env` adds to the cluster's environment."""
        self.roots.append(tempfile.mkdtemp(prefix="slea-ray-"))
        port = port or free_port()
        # Free ports for the head's services that default to fixed ones, where a user's Ray listens.
        fixed = ("--ray-client-server-port", "--dashboard-port", "--dashboard-agent-listen-port")
        result = subprocess.run(
            ["ray", "start", "--head", f"--port={port}", f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]
            + [f"{option}={free_port()}" for option in fixed]
            + list(args),
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"ray start --head failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        self.address = f"{get_node_ip_address()}:{port}"
        return self.address

    @property
    def temp_dir(self) -> Path:
        """The newest cluster's temp dir."""
        return Path(self.roots[-1]) / "ray"

    @property
    def session_dir(self) -> Path:
        """The newest cluster's session directory (its logs/ hold monitor.log, raylet.out, ...)."""
        return self.temp_dir / "session_latest"

    def processes(self, title_prefix: str = "") -> list[psutil.Process]:
        """This cluster's live processes whose command line starts with `title_prefix`."""
        found = []
        for process in psutil.process_iter(["cmdline", "name", "status"]):
            try:
                if process.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                title = " ".join(process.info["cmdline"] or [process.info["name"] or ""])
                if title.startswith(title_prefix) and process.environ().get("SLEA_TEST_CLUSTER") == self.marker:
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def signal(self, title_prefix: str, signum: int) -> int:
        """Send `signum` to this cluster's processes whose title starts with `title_prefix`
        (an actor's worker is titled `ray::<ActorClass>`); returns how many got it."""
        sent = 0
        for process in self.processes(title_prefix):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signum)
                sent += 1
        return sent

    def stop(self, timeout_s: float = 60) -> None:
        """SIGKILL every process of this cluster at once (as `ray stop --force` would, for this one
        only: nothing gets to shut down) and wait until none is left."""
        deadline = time.monotonic() + timeout_s
        while left := self.processes():
            assert time.monotonic() < deadline, (
                f"processes of the test's Ray cluster still alive after {timeout_s:.0f} s: {[p.pid for p in left]}"
            )
            for process in left:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            time.sleep(0.2)

    def close(self) -> None:
        """stop(), then remove the temp dirs."""
        self.stop()
        for root in self.roots:
            shutil.rmtree(root, ignore_errors=True)


class LocalAutoscalingCluster(AutoscalingCluster):
    """Ray's own AutoscalingCluster (the real autoscaler, nodes as processes on this machine), with
    two changes: its start() and shutdown() run `ray stop --force`, which ends every Ray on the
    machine, so here the cluster is a TaggedRay (its own temp dir and port, stopped by its marker:
    the nodes the autoscaler starts are processes of the head's monitor and carry it too); and
    `_generate_config` builds the config that Ray 2.60's wheel lacks (`fake_multi_node/example.yaml`)."""

    def start(self, override_env: dict | None = None) -> str:
        """Start the head (the autoscaler in its monitor); returns the GCS address to join."""
        self.ray = TaggedRay()
        head = dict(self._head_resources)
        args = [f"--num-cpus={head.pop('CPU')}"] if "CPU" in head else []
        if "object_store_memory" in head:
            args.append(f"--object-store-memory={head.pop('object_store_memory')}")
        if head:
            args.append(f"--resources={json.dumps(head)}")
        config_file = Path(tempfile.mkdtemp(prefix="slea-autoscaler-")) / "autoscaling.json"
        self._config_file = config_file
        port = free_port()
        # The fake provider's nodes join the head at the provider's gcs_address (by default port 6379,
        # where a user's own `ray start` listens).
        self._config["provider"]["gcs_address"] = f"{get_node_ip_address()}:{port}"
        config_file.write_text(json.dumps(self._config))
        env = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1", **(override_env or {})}
        return self.ray.start_head(f"--autoscaling-config={config_file}", *args, env=env, port=port)

    def shutdown(self) -> None:
        self.ray.close()
        shutil.rmtree(self._config_file.parent, ignore_errors=True)

    def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **config_kwargs):
        if autoscaler_v2:
            raise NotImplementedError("the fake provider's v2 settings are not built here")
        return {
            "cluster_name": "fake_multinode",
            "max_workers": 8,
            "provider": {
                "type": "fake_multinode",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
            },
            "available_node_types": {
                **worker_node_types,
                "ray.head.default": {"resources": head_resources, "node_config": {}, "max_workers": 0},
            },
            "head_node_type": "ray.head.default",
            "auth": {},
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 0.1,
            "docker": {},
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            **config_kwargs,
        }


def assert_the_prefix_cache_was_reset(out: dict) -> None:
    """What vllm_prefix_cache_probe.prefix_cache_reset found: a prompt cached before the reset is not after it."""
    assert out["error"] is None, out["error"]
    assert out["before"] > 0, "the prompt was never cached: the check cannot tell a reset from none"
    assert out["after"] == 0, f"{out['after']} prompt tokens still came from the cache of the old weights"
