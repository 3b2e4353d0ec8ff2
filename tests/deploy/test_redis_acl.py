"""The shipped Redis setup, run for real: the init container's script builds the ACL file from
Secret files, redis-server starts with the shipped redis.conf and arguments, and then the default
user is off, the system's user `slea` can do what the system does (stream, dead letters, trims,
library and actor keys) but nothing else, the readiness probe passes without the password on its
command line, maxmemory/noeviction hold, and the real prometheus-redis-exporter reads Redis as
its own limited user."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from k8s_render import K8S, REPO, entrypoint_config, find, kustomize
from prometheus_client.parser import text_string_to_metric_families
from required_tools import redis_exporter

from library.sync import Publisher, deltas_key, epoch_key, snapshot_key
from slea.channels import CURRENT_LIBRARY_RUN_KEY, inflight_key, policy_version_key, sync_claims_key
from slea.config import RedisConfig
from slea.ports import free_port
from slea.records import StepRecord
from slea.redis_conn import connect
from slea.stream_admin import expire_run, group_stats, trim_acknowledged
from slea.streams import PAYLOAD_FIELD, StreamConsumer, StreamProducer

SECRET_DIR, CONFIG_DIR, ACL_DIR = "/etc/slea-redis/secret", "/etc/slea-redis/config", "/run/slea-redis"


@pytest.fixture(scope="module")
def shipped_redis(tmp_path_factory):
    """The cpu-kind overlay's Redis pod, run here: its files, its init command, its server args."""
    root = tmp_path_factory.mktemp("redis-pod")
    manifests = kustomize(K8S / "overlays" / "cpu-kind")
    statefulset = find(manifests, "StatefulSet", "slea-redis")
    pod = statefulset["spec"]["template"]["spec"]
    (config_map,) = [
        doc
        for doc in manifests
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("slea-redis-config")
    ]
    paths = {SECRET_DIR: root / "secret", CONFIG_DIR: root / "config", ACL_DIR: root / "acl"}
    for directory in paths.values():
        directory.mkdir()
    for name, text in config_map["data"].items():
        (paths[CONFIG_DIR] / name).write_text(text)
    (paths[SECRET_DIR] / "password").write_text(
        "system-password-0123"
    )  # as `kubectl create secret --from-literal` writes it
    (paths[SECRET_DIR] / "exporter-password").write_text("exporter-password-4567")

    def local(argument: str) -> str:
        for pod_path, here in paths.items():
            argument = argument.replace(pod_path, str(here))
        return argument

    (init,) = pod["initContainers"]
    subprocess.run([local(a) for a in init["command"]], check=True, timeout=30)
    redis_container, exporter = pod["containers"]

    def launch(data: Path, port: int) -> subprocess.Popen:
        """redis-server as the container runs it, with `data` as its /data volume."""
        data.mkdir(exist_ok=True)
        args = [str(data) if a == "/data" else local(a) for a in redis_container["args"][1:]]
        return subprocess.Popen(
            [
                shutil.which("redis-server"),
                *args,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--aclfile",
                str(paths[ACL_DIR] / "users.acl"),
                "--logfile",
                str(data / "redis.log"),
            ]
        )

    def system_user(port: int) -> RedisConfig:
        return RedisConfig(
            url=f"redis://127.0.0.1:{port}/0",
            username="slea",
            password_env=None,
            password_file=str(paths[SECRET_DIR] / "password"),
        )

    def wait_up(server: subprocess.Popen, port: int, log: Path) -> None:
        deadline = time.monotonic() + 15
        while True:
            try:
                connect(system_user(port)).ping()
                return
            except redis.ConnectionError:
                assert server.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "redis-server did not come up"
                time.sleep(0.1)

    port = free_port()
    server = launch(root / "data", port)
    wait_up(server, port, root / "data" / "redis.log")
    system = system_user(port)
    yield {
        "port": port,
        "system": system,
        "paths": paths,
        "local": local,
        "redis": redis_container,
        "exporter": exporter,
        "root": root,
        "launch": launch,
        "system_user": system_user,
        "wait_up": wait_up,
    }
    server.terminate()
    server.wait(timeout=10)


def test_no_password_in_the_generated_acl_or_anywhere_in_the_pod_spec(shipped_redis):
    acl = (shipped_redis["paths"][ACL_DIR] / "users.acl").read_text()
    assert "system-password-0123" not in acl and "exporter-password-4567" not in acl
    assert "user default off" in acl
    for container in (shipped_redis["redis"], shipped_redis["exporter"]):
        assert "env" not in container and not any("pass" in a and "file" not in a for a in container.get("args", []))


def test_the_default_user_is_off(shipped_redis):
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=shipped_redis["port"]).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=shipped_redis["port"], password="system-password-0123").ping()


def test_transactions_survive_a_sigkill_and_the_aof_replay(shipped_redis, tmp_path):
    """With `appendonly` on the claim, what the system wrote before a SIGKILL is back after the
    replay, transactions (MULTI/EXEC: redis-py pipelines, the library's current-run switch)
    included. Redis replays an AOF's EXEC as the default user and checks that user's permissions
    again (redis/redis#14541, fixed in 8.x by #14545; valkey-io/valkey#3983): with the default
    user off *and without commands*, every transaction was dropped on restart with "NOPERM ACLs
    rules changed" in the log, found by tests/deploy/test_deployment_runs.py. The default user
    stays off (nobody can log in as it) but holds every permission, so the replay keeps them."""
    port = free_port()
    server = shipped_redis["launch"](tmp_path / "data", port)
    try:
        shipped_redis["wait_up"](server, port, tmp_path / "data" / "redis.log")
        client = connect(shipped_redis["system_user"](port))
        with client.pipeline() as transaction:  # transaction=True: MULTI ... EXEC in the AOF
            transaction.xadd("slea:cluster-t:steps", {"a": "1"})
            transaction.set(policy_version_key("cluster-t"), 3)
            transaction.execute()
        client.xadd("slea:cluster-t:steps", {"b": "2"})
        client.close()
        time.sleep(1.5)  # appendfsync everysec: what the last second wrote may go, by design
        server.kill()
        server.wait(timeout=10)
        server = shipped_redis["launch"](tmp_path / "data", port)
        shipped_redis["wait_up"](server, port, tmp_path / "data" / "redis.log")
        client = connect(shipped_redis["system_user"](port))
        assert client.xlen("slea:cluster-t:steps") == 2, (tmp_path / "data" / "redis.log").read_text()[-1500:]
        assert client.get(policy_version_key("cluster-t")) == b"3"
        client.close()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
    finally:
        server.kill()
        server.wait(timeout=10)


def test_the_system_user_does_what_the_system_does(shipped_redis):
    client = connect(shipped_redis["system"])
    stream, dead = "slea:cluster:steps", "slea:cluster:dead"

    records = [StepRecord("cluster", "t", "pick", "alfworld", "g", "e", step, "obs") for step in range(4)]
    StreamProducer(client, stream).send(records)
    client.xadd(stream, {PAYLOAD_FIELD: b"junk"})
    readers = {
        group: StreamConsumer(client, stream, group=group, consumer=f"{group}-0", dead_letter_key=dead, claim_idle_ms=1)
        for group in ("learner", "library")
    }
    for reader in readers.values():
        deliveries = reader.read(count=10, block_ms=10)
        assert len(deliveries) == 4
        reader.ack([d.entry_id for d in deliveries])
        reader.claim_idle()
    assert client.xlen(dead) == 2  # the junk entry, once per group
    assert {name: stats.lag for name, stats in group_stats(client, stream).items()} == {"learner": 0, "library": 0}
    trim_acknowledged(client, stream, ["learner", "library"])
    # the library's replicated state and the actors' bookkeeping (library/sync.py, actors/worker.py)
    pipe = client.pipeline(transaction=True)
    pipe.set(snapshot_key("cluster"), b"{}")
    pipe.set(epoch_key("cluster"), b"1")
    pipe.execute()
    client.xadd(deltas_key("cluster"), {"d": b"{}"})
    assert client.get(epoch_key("cluster")) == b"1" and client.xrange(deltas_key("cluster"))
    client.xtrim(deltas_key("cluster"), minid="0-1")
    client.hset(inflight_key("cluster", 0), "episode", b"x")
    assert client.hgetall(inflight_key("cluster", 0)) == {b"episode": b"x"}
    client.hdel(inflight_key("cluster", 0), "episode")
    assert client.hincrby(sync_claims_key("cluster"), "3", 1) == 1
    # the learner's version record (learner/weights.py) and the new-run check (slea/services.py)
    Publisher(client, "cluster").start("{}")  # a writer's start names its run current (library/sync.py)
    assert client.get(CURRENT_LIBRARY_RUN_KEY) == b"cluster"
    Publisher(client, "cluster-next").start("{}")  # a later run takes it: WATCH, and `cluster`'s start time read
    assert client.get(CURRENT_LIBRARY_RUN_KEY) == b"cluster-next"
    client.set(policy_version_key("cluster"), 7)
    assert client.get(policy_version_key("cluster")) == b"7" and client.exists(stream)
    # the run's retention (driver/retention.py): a live driver sets its keys' expiry again and again
    assert expire_run(client, "cluster", 3600) >= 5


def test_the_system_user_reaches_the_keys_of_a_submitted_run(shipped_redis, rendered):
    """A submission's run id is its pods' slea.io/run label, cluster-<anything> for a new run
    (deploy/README.md): the ACL must let the system use that run's keys, not only `cluster`'s."""
    rayjob = find(rendered["gpu"], "RayJob")
    assert entrypoint_config(rayjob)[0].run.id == "cluster"
    run_id = "cluster-exp2"
    client = connect(shipped_redis["system"])
    StreamProducer(client, f"slea:{run_id}:steps").send(
        [StepRecord(run_id, "t", "pick", "alfworld", "g", "e", 0, "obs")]
    )
    client.set(epoch_key(run_id), b"1")
    assert client.xlen(f"slea:{run_id}:steps") == 1 and client.get(epoch_key(run_id)) == b"1"


def runbook_redis_commands() -> list[str]:
    """Every `redis-cli --user slea --askpass <command>` the runbook tells an operator to run."""
    runbook = (REPO / "docs" / "runbook.md").read_text()
    return re.findall(r"`redis-cli --user slea --askpass ([^`]+)`", runbook)


def test_the_runbook_tells_operators_to_talk_to_redis_as_the_slea_user():
    text = (REPO / "docs" / "runbook.md").read_text()
    assert runbook_redis_commands(), "the runbook has no Redis command: this test would check nothing"
    assert text.count("redis-cli") == len(runbook_redis_commands()), "every redis-cli line uses the slea user"


@pytest.mark.parametrize("command", runbook_redis_commands())
def test_every_runbook_redis_command_works_as_the_slea_user(shipped_redis, command):
    """As the runbook gives it, for the run `cluster`: the ACL must let it through (XREVRANGE once got NOPERM)."""
    client = connect(shipped_redis["system"])
    client.xadd("slea:cluster:dead", {"reason": "malformed: test", "payload": b"x"})
    client.execute_command(*shlex.split(command.replace("<run>", "cluster")))


@pytest.mark.parametrize(
    "command",
    [
        ("SET", "other:key", "x"),
        ("GET", "slea:otherrun:steps"),
        ("FLUSHALL",),
        ("CONFIG", "SET", "maxmemory", "0"),
        ("KEYS", "*"),
        ("ACL", "LIST"),
        ("SHUTDOWN",),
    ],
)
def test_the_system_user_can_do_nothing_else(shipped_redis, command):
    with pytest.raises(redis.exceptions.NoPermissionError):
        connect(shipped_redis["system"]).execute_command(*command)


def test_readiness_probe_passes_without_the_password_in_its_command(shipped_redis):
    probe = shipped_redis["redis"]["readinessProbe"]["exec"]["command"]
    assert "system-password-0123" not in " ".join(probe)
    script = shipped_redis["local"](probe[2]).replace("redis-cli ", f"redis-cli -p {shipped_redis['port']} ", 1)
    assert subprocess.run([probe[0], probe[1], script], timeout=30).returncode == 0


def test_maxmemory_with_noeviction(shipped_redis):
    args = shipped_redis["redis"]["args"]
    limit = args[args.index("--maxmemory") + 1]
    assert limit == "384mb"
    exporter = redis.Redis(port=shipped_redis["port"], username="exporter", password="exporter-password-4567")
    assert exporter.config_get("maxmemory") == {"maxmemory": str(384 * 1024 * 1024)}
    assert exporter.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    with pytest.raises(redis.exceptions.NoPermissionError):
        exporter.get("slea:cluster:steps")


def test_the_real_exporter_scrapes_redis_as_its_own_user(shipped_redis):
    binary = redis_exporter()
    local, port = shipped_redis["local"], shipped_redis["port"]
    password_file = shipped_redis["paths"][ACL_DIR] / "exporter-passwords.json"
    # the pod's exporter reaches Redis at localhost:6379; here Redis listens on `port`
    moved = shipped_redis["root"] / "exporter-passwords.json"
    moved.write_text(password_file.read_text().replace("localhost:6379", f"localhost:{port}"))
    web = free_port()
    args = [
        local(a)
        .replace("localhost:6379", f"localhost:{port}")
        .replace(str(password_file), str(moved))
        .replace("-web.listen-address=:9121", f"-web.listen-address=127.0.0.1:{web}")
        for a in shipped_redis["exporter"]["args"]
    ]
    process = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, text = time.monotonic() + 20, ""
        while time.monotonic() < deadline and "redis_up 1" not in text:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{web}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.2)
        samples = {
            sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples
        }
        assert samples["redis_up"] == 1, text[-2000:]
        assert samples["redis_memory_max_bytes"] == 384 * 1024 * 1024
    finally:
        process.terminate()
        process.wait(timeout=10)
