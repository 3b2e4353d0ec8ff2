"""A bounded load test of the retrieval app's HTTP endpoint on a real local Ray Serve.

Local addresses only and a fixed plan: REQUESTS POSTs to /retrieve_batch, sent at a fixed RATE
(so over REQUESTS / RATE seconds) by at most CONCURRENCY clients, against one replica bounded to
1 ongoing and 2 queued requests. The arrival rate is several times what the replica can answer,
so the queue bound is passed: the excess must get 503 with Serve's back-pressure reason, nothing
may get any other 5xx, and the replica must still answer afterwards. The figures (p50/p99 of the
answered requests, the rejection count) are printed (run with -s to see them).
"""

import http.client
import json
import statistics
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

REQUESTS = 240
RATE = 20.0  # requests per second: 12 s of load
CONCURRENCY = 32
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
    start = time.perf_counter() + 0.5

    def one(index: int) -> tuple[int, str, float]:
        time.sleep(max(0.0, start + index / RATE - time.perf_counter()))
        body = json.dumps(
            {
                "observations": [
                    f"You arrive at shelf {index}-{j}. On it you see a mug {j}."
                    for j in range(OBSERVATIONS_PER_REQUEST)
                ],
                "task_types": ["pick"] * OBSERVATIONS_PER_REQUEST,
            }
        ).encode()
        return request(port, "POST", "/retrieve_batch", body)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(one, range(REQUESTS)))
    elapsed = time.perf_counter() - start
    statuses = [status for status, _body, _latency in results]
    answered = sorted(latency for status, _body, latency in results if status == 200)
    rejected = [(body, latency) for status, body, latency in results if status == 503]
    every = sorted(latency for _status, _body, latency in results)
    p = lambda values, q: values[min(len(values) - 1, round(q * (len(values) - 1)))] * 1000  # noqa: E731
    print(
        f"\nload test: {REQUESTS} requests at {RATE:.0f}/s over {elapsed:.1f} s, {OBSERVATIONS_PER_REQUEST} "
        f"observations each: {len(answered)} answered (p50 {p(answered, 0.5):.0f} ms, p99 {p(answered, 0.99):.0f} ms), "
        f"{len(rejected)} rejected with 503 (p50 {statistics.median(latency for _body, latency in rejected) * 1000:.1f} ms); "
        f"all requests p50 {p(every, 0.5):.0f} ms, p99 {p(every, 0.99):.0f} ms"
    )
    assert set(statuses) <= {200, 503}, f"statuses other than 200 and 503: {sorted(set(statuses) - {200, 503})}"
    assert answered and rejected, f"{len(answered)} answered, {len(rejected)} rejected: the bound was not reached"
    for body, _latency in rejected:
        assert "backpressure" in body and "max_queued_requests=2" in body, body
    # the replica survives: it answers a normal request and the app is still running
    status, body, _latency = request(
        port,
        "POST",
        "/retrieve_batch",
        json.dumps({"observations": ["You arrive at fridge 1."], "task_types": ["pick"]}).encode(),
    )
    assert status == 200 and json.loads(body)["results"][0]["experiences"], body
    assert serve.status().applications["slea-library"].status == "RUNNING"
