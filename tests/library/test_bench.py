"""`slea bench retrieval` end to end with tiny sizes: all three paths answer and the figures add up."""

import pytest
from helpers import serve_http_port
from library_helpers import library_config

from library.bench import bench_retrieval, build_library
from library.retrieval import retrieve
from slea.config import SleaConfig

pytestmark = pytest.mark.slow  # MiniLM, Ray and Serve


def test_benchmark_library_puts_two_of_each_zone_in_every_cluster(embedder):
    config = SleaConfig.model_validate(
        {
            "library": library_config(
                strategy_capacity={"principle": 50, "method": 50, "example": 50},
                warning_capacity={"mistake": 50, "pattern": 50, "diagnostic": 50},
            ).model_dump()
        }
    )
    library = build_library(config, embedder, n_experiences=40, n_clusters=20)
    observation = library.clusters["pick_and_place"].by_id["pick_and_place/c3"].representative
    answer = retrieve(library, observation, "pick_and_place")
    assert answer["source"] == "cluster" and [item["zone"] for item in answer["experiences"]] == [
        "strategy",
        "warning",
        "strategy",
    ]


def test_bench_retrieval_reports_every_path(redis_server):
    port = serve_http_port()
    result = bench_retrieval(
        n_experiences=200, n_clusters=100, batch_size=8, batches=10, redis_url=redis_server.url, http_port=port
    )
    for key in ("inproc_p50_ms", "inproc_miss_p50_ms", "handle_p50_ms", "handle_p99_ms", "http_p50_ms"):
        assert result[key] > 0
    # the p50s are rounded to microseconds, the ratio is computed before rounding
    assert abs(result["ratio"] - result["handle_p50_ms"] / result["inproc_p50_ms"]) < 0.02 * result["ratio"] + 0.01
    assert result["handle_p50_ms"] <= result["handle_p99_ms"]
