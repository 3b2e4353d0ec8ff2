"""The actors' retrieval client against a real Ray Serve app under the library's app name: every
outcome is counted, a raising replica is logged with its reason, and repeats are rate-limited."""

import asyncio
import logging

import pytest
import ray
from prometheus_client import REGISTRY
from ray import serve

from actors.retrieval_client import RetrievalClient
from slea.channels import LIBRARY_APP

pytestmark = pytest.mark.slow

KNOWN = "You arrive at fridge 1. The fridge 1 is closed."
STRATEGY = {"experience_id": "s1", "zone": "strategy", "text": "Open the fridge before looking inside it."}


@serve.deployment
class ScriptedLibrary:
    """Stands in for the library app: answers by observation. Any observation starting with
    "raise" makes the whole call raise, "slow" outlasts the client's timeout, KNOWN gets one
    strategy, anything else none."""

    async def retrieve_batch(self, request: dict) -> list[dict]:
        observations = request["observations"]
        if any(observation.startswith("raise") for observation in observations):
            raise ValueError("library index is corrupt: cluster 7 has no centroid")
        if "slow" in observations:
            await asyncio.sleep(3.0)
        return [
            {
                "experiences": [STRATEGY] if observation == KNOWN else [],
                "library_version": 4,
                "cluster_id": "c7" if observation == KNOWN else "",
            }
            for observation in observations
        ]


@pytest.fixture(scope="module")
def library_app():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(proxy_location="Disabled")
    serve.run(ScriptedLibrary.bind(), name=LIBRARY_APP, route_prefix=None)
    yield
    serve.shutdown()
    ray.shutdown()


def outcomes() -> dict[str, float]:
    return {
        outcome: REGISTRY.get_sample_value("slea_actor_retrieval_requests_total", {"outcome": outcome}) or 0.0
        for outcome in ("hit", "empty", "timeout", "error", "unavailable")
    }


def grown(before: dict[str, float]) -> dict[str, float]:
    return {outcome: count - before[outcome] for outcome, count in outcomes().items() if count != before[outcome]}


def failure_lines(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "actors.retrieval_client" and r.levelno == logging.WARNING
    ]


def test_outcomes_are_counted_and_errors_logged_once_per_window(library_app, caplog):
    client = RetrievalClient(k_strategies=2, k_warnings=1, max_tokens=200, timeout_s=1.0)

    async def burst(*observations):
        return await asyncio.gather(*(client.retrieve(observation, "pick") for observation in observations))

    async def scenario():
        steps = {}
        before = outcomes()
        answered = await burst(KNOWN, "You are in the middle of a room.")
        steps["answered"] = (answered, grown(before))
        before = outcomes()
        failed = await burst("raise 1", "raise 2", "raise 3")
        steps["error"] = (failed, grown(before), failure_lines(caplog))
        before = outcomes()
        await burst("raise 4", "raise 5")  # within the 30 s window: counted, not logged again
        steps["error again"] = (grown(before), failure_lines(caplog))
        before = outcomes()
        timed_out = await burst("slow")
        steps["timeout"] = (timed_out, grown(before), failure_lines(caplog))
        return steps

    with caplog.at_level(logging.WARNING, logger="actors.retrieval_client"):
        steps = asyncio.run(scenario())
    client.close()

    answered, counted = steps["answered"]
    assert counted == {"hit": 1, "empty": 1}
    assert [e.text for e in answered[0].experiences] == [STRATEGY["text"]] and answered[0].cluster_id == "c7"
    assert answered[1].hit and answered[1].experiences == [] and answered[1].library_version == 4

    failed, counted, lines = steps["error"]
    assert counted == {"error": 3} and all(not r.hit and r.experiences == [] for r in failed)
    assert len(lines) == 1, lines
    assert "library retrieval failed (ValueError: library index is corrupt: cluster 7 has no centroid)" in lines[0]
    assert "Traceback" not in lines[0]

    counted, lines_after = steps["error again"]
    assert counted == {"error": 2} and lines_after == lines

    timed_out, counted, lines_after = steps["timeout"]
    assert (
        counted == {"timeout": 1} and not timed_out[0].hit and lines_after == lines
    )  # slow is not broken: no log line
    assert client.misses == 6


def test_an_app_that_is_not_deployed_counts_as_unavailable_and_says_so(library_app, caplog):
    client = RetrievalClient(k_strategies=2, k_warnings=1, max_tokens=200, timeout_s=1.0, app_name="slea-no-such-app")
    before = outcomes()
    with caplog.at_level(logging.WARNING, logger="actors.retrieval_client"):
        retrieved = asyncio.run(client.retrieve(KNOWN, "pick"))
    client.close()
    assert not retrieved.hit and grown(before) == {"unavailable": 1}
    lines = failure_lines(caplog)
    assert len(lines) == 1 and "library app 'slea-no-such-app' unavailable" in lines[0], lines
