"""A bounded load test of the retrieval app's HTTP endpoint on a real local Ray Serve.

Local addresses only and a fixed plan: BURSTS bursts of CLIENTS POSTs to /retrieve_batch, each
burst's clients released together by a barrier, against one replica bounded to 1 ongoing and 2
queued requests. A burst arrives within milliseconds, well inside the time one request takes, so
the queue bound is passed however fast the machine is: the excess must get 503 with Serve's
back-pressure reason, nothing may get any other 5xx, and the replica must still answer
afterwards. The figures (p50/p99 of the answered requests, the rejection count) are printed once
the checks pass (run with -s to see them).
"""

import http.client
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import redis
from helpers import listening_addresses, serve_http_port
from library_helpers import candidate, library_config
from ray import serve

from library.experience import STRATEGY, WARNING
from library.persistence import snapshot_text
from library.service import start_serve_app
from library.state import Library
from library.sync import Publisher
from slea.config import SleaConfig

BURSTS = 4
CLIENTS = 24  # per burst, sent at once: 21 more than the replica's 1 ongoing + 2 queued
OBSERVATIONS_PER_REQUEST = 32  # distinct texts, so every request embeds (the LRU cache cannot answer it)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bounded_app(redis_server, embedder, policy_tokenizer):
    """One replica, max_ongoing_requests=1, max_queued_requests=2, HTTP on the default host."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    values = library_config(
        http_port=serve_http_port(),
        replicas=1,
        max_replicas=1,
        max_ongoing_requests=1,
        max_queued_requests=2,
        target_ongoing_requests=1,
        max_batch_observations=64,
    ).model_dump()
    config = SleaConfig.model_validate({"run": {"id": "loadtest"}, "library": values})
    library = Library(config.library, embedder, policy_tokenizer)
    library.admit(
        [
            candidate("Open the fridge before looking inside it.", 0.9, observation="You arrive at fridge 1."),
            candidate(
                "Never put the sponge in the fridge.",
                0.7,
                zone=WARNING,
                level="mistake",
                observation="You arrive at fridge 1.",
            ),
        ],
        {STRATEGY: 10, WARNING: 5},
    )
    library.commit()
    Publisher(client, config.run.id).start(snapshot_text(library, []))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start_serve_app(config, redis_server.url)
    yield config
    serve.shutdown()
    ray.shutdown()
    client.close()


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, str, float]:
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace"), time.perf_counter() - start
    finally:
        connection.close()


def test_serve_http_listens_on_loopback_only_by_default(bounded_app):
    assert bounded_app.library.http_host == "127.0.0.1"
    assert request(bounded_app.library.http_port, "GET", "/healthz")[0] == 200
    assert listening_addresses(bounded_app.library.http_port) == {"127.0.0.1"}  # not 0.0.0.0


def test_load_past_the_queue_bound_gets_503_with_a_reason_and_the_replica_lives(bounded_app):
    port = bounded_app.library.http_port
    gate = threading.Barrier(CLIENTS, timeout=60)  # one thread per client: the pool has CLIENTS threads

    def one(index: int) -> tuple[int, str, float]:
        body = json.dumps(
            {
                "observations": [
                    f"You arrive at shelf {index}-{j}. On it you see a mug {j}."
                    for j in range(OBSERVATIONS_PER_REQUEST)
                ],
                "task_types": ["pick"] * OBSERVATIONS_PER_REQUEST,
            }
        ).encode()
        gate.wait()  # the burst's clients go together
        return request(port, "POST", "/retrieve_batch", body)

    start = time.perf_counter()
    bursts = []
    with ThreadPoolExecutor(CLIENTS) as pool:
        for burst in range(BURSTS):
            bursts.append(list(pool.map(one, range(burst * CLIENTS, (burst + 1) * CLIENTS))))
    elapsed = time.perf_counter() - start
    results = [result for burst in bursts for result in burst]
    statuses = [status for status, _body, _latency in results]
    answered = sorted(latency for status, _body, latency in results if status == 200)
    rejected = [(body, latency) for status, body, latency in results if status == 503]
    assert set(statuses) <= {200, 503}, f"statuses other than 200 and 503: {sorted(set(statuses) - {200, 503})}"
    per_burst = [[status for status, _body, _latency in burst].count(503) for burst in bursts]
    assert answered and all(per_burst), f"{len(answered)} answered, rejected per burst {per_burst}: a bound not reached"
    for body, _latency in rejected:
        assert "backpressure" in body and "max_queued_requests=2" in body, body
    every = sorted(latency for _status, _body, latency in results)
    p = lambda values, q: values[min(len(values) - 1, round(q * (len(values) - 1)))] * 1000  # noqa: E731
    print(
        f"\nload test: {BURSTS} bursts of {CLIENTS} requests at once over {elapsed:.1f} s, {OBSERVATIONS_PER_REQUEST} "
        f"observations each: {len(answered)} answered (p50 {p(answered, 0.5):.0f} ms, p99 {p(answered, 0.99):.0f} ms), "
        f"{len(rejected)} rejected with 503 (p50 {statistics.median(latency for _body, latency in rejected) * 1000:.1f} ms); "
        f"all requests p50 {p(every, 0.5):.0f} ms, p99 {p(every, 0.99):.0f} ms"
    )
    # the replica survives: it answers a normal request and the app is still running
    status, body, _latency = request(
        port,
        "POST",
        "/retrieve_batch",
        json.dumps({"observations": ["You arrive at fridge 1."], "task_types": ["pick"]}).encode(),
    )
    assert status == 200 and json.loads(body)["results"][0]["experiences"], body
    assert serve.status().applications["slea-library"].status == "RUNNING"
