"""`serve_library` as a process: it consumes a run's stream, serves what it learnt over HTTP,
and on SIGTERM snapshots, acknowledges and exits 0."""

import http.client
import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import serve_http_port
from library_helpers import steps_of

from library.persistence import latest_snapshot, parse_snapshot
from slea.config import SleaConfig
from slea.streams import StreamProducer

pytestmark = pytest.mark.slow  # `slea serve-library` starts Ray and Serve

KITCHEN = ["You are in the kitchen. You see a fridge 1 and a countertop 1.", "On the countertop 1, you see an apple 1."]


def get(url: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(request, timeout=10).read())


def test_serve_library_process(redis_url, redis_client, tmp_path):
    port = serve_http_port()
    overrides = [
        f"redis.url={redis_url}",
        "run.id=svc",
        f"run.dir={tmp_path}",
        f"library.http_port={port}",
        "library.max_replicas=1",
        "library.warmup_versions=0",
        "library.warmup_experiences=0",
        "ray.num_cpus=2",
    ]
    code = (
        "import sys; from slea.config import load_config; from library.service import serve_library; "
        f"sys.exit(serve_library(load_config(None, {overrides!r})))"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        records = []
        for version, group in ((0, "g1"), (1, "g2")):  # g2's newer policy version closes g1's window
            records += steps_of(
                f"{group}-win",
                KITCHEN,
                ["go to countertop 1", "take apple 1"],
                success=True,
                group_id=group,
                policy_version=version,
                run_id="svc",
            )
        StreamProducer(redis_client, SleaConfig.model_validate({"run": {"id": "svc"}}).stream_key()).send(records)
        deadline, answer = time.monotonic() + 150, None
        while time.monotonic() < deadline:
            try:
                answer = get(f"http://127.0.0.1:{port}/retrieve", {"observation": KITCHEN[0], "task_type": "pick"})
                if answer["library_version"] >= 1:
                    break
            except (OSError, http.client.HTTPException):  # not up yet, or another local server answered
                pass
            time.sleep(1)
        assert answer is not None and answer["library_version"] >= 1 and answer["cluster_id"] == "pick/c0", answer
        assert "go to countertop 1; take apple 1" in answer["experiences"][0]["text"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0
    header, _clusters, experiences = parse_snapshot(latest_snapshot(tmp_path / "svc").read_text())
    assert header["version"] == 2 and experiences  # the open window (g2) was applied at shutdown
    assert redis_client.xpending("slea:svc:steps", "library")["pending"] == 0
