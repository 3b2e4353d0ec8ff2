"""The retrieval app on a real local Ray Serve: handle and HTTP answer alike; bad requests get 4xx."""

import http.client
import json

import pytest
import ray
import redis
from helpers import serve_http_port
from library_helpers import candidate, library_config
from ray import serve

from library.experience import STRATEGY, WARNING
from library.persistence import snapshot_text
from library.retrieval import retrieve_batch
from library.service import start_serve_app
from library.state import Library
from library.sync import Publisher
from slea.config import SleaConfig

FRIDGE = "You arrive at fridge 1. The fridge 1 is closed."
SINK = "You arrive at sinkbasin 1. On the sinkbasin 1, you see a sponge 2."


@pytest.fixture(scope="module")
def served(redis_server, embedder, policy_tokenizer):
    """A writer-side library published to Redis, and the app following it on one replica."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    lib_values = library_config(
        http_port=serve_http_port(), max_request_bytes=65_536, max_batch_observations=64, max_observation_chars=2000
    ).model_dump()
    config = SleaConfig.model_validate({"run": {"id": "servetest"}, "library": lib_values})
    library = Library(config.library, embedder, policy_tokenizer)
    library.admit(
        [
            candidate("Open the fridge before looking inside it.", 0.9, observation=FRIDGE),
            candidate("Rinse the sponge in the sink.", 0.5, observation=SINK),
            candidate("Never put the sponge in the fridge.", 0.7, zone=WARNING, level="mistake", observation=FRIDGE),
        ],
        {STRATEGY: 10, WARNING: 5},
    )
    library.commit()
    publisher = Publisher(client, config.run.id)
    publisher.start(snapshot_text(library, []))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    handle = start_serve_app(config, redis_server.url)
    yield config, library, publisher, handle
    serve.shutdown()
    ray.shutdown()
    client.close()


def post(config, path, body, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", config.library.http_port, timeout=30)
    connection.request(
        "POST" if body is not None else "GET",
        path,
        body=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    response = connection.getresponse()
    status, payload = response.status, json.loads(response.read())
    connection.close()
    return status, payload


def test_handle_and_http_answer_as_in_process(served):
    config, library, _, handle = served
    expected = retrieve_batch(library, [FRIDGE, SINK], ["pick", "pick"])
    assert handle.retrieve.remote({"observation": FRIDGE, "task_type": "pick"}).result() == expected[0]
    assert (
        handle.retrieve_batch.remote({"observations": [FRIDGE, SINK], "task_types": ["pick", "pick"]}).result()
        == expected
    )
    got = post(config, "/retrieve", json.dumps({"observation": FRIDGE, "task_type": "pick"}))
    assert got == (200, expected[0]), got
    status, payload = post(
        config, "/retrieve_batch", json.dumps({"observations": [FRIDGE, SINK], "task_types": ["pick"] * 2})
    )
    assert status == 200 and payload["results"] == expected
    status, stats = post(config, "/stats", None)
    assert status == 200 and stats["library_version"] == 1 and stats["experiences"]["strategy/method"] == 2
    assert post(config, "/healthz", None)[1]["ok"] is True


@pytest.mark.parametrize(
    "body, status, says",
    [
        ("{not json", 400, "not valid JSON"),
        ('["a list"]', 422, "JSON object"),
        ('{"observation": 42, "task_type": "pick"}', 422, "observation"),
        ('{"observation": "x", "task_type": "pick", "k_strategies": "2"}', 422, "k_strategies"),
        ('{"observation": "x", "task_type": "pick", "k_strategies": 1000}', 422, "k_strategies"),
        ('{"observation": "x", "task_type": "pick", "max_tokens": 0}', 422, "max_tokens"),
        ('{"observation": "x", "task_type": "pick", "surprise": 1}', 422, "surprise"),
        ('{"observation": "' + "x" * 3000 + '", "task_type": "pick"}', 413, "characters"),
        ('{"observation": "' + "x" * 70_000 + '", "task_type": "pick"}', 413, "bytes"),
    ],
)
def test_bad_http_requests_get_4xx_with_a_message(served, body, status, says):
    config = served[0]
    got_status, payload = post(config, "/retrieve", body)
    assert got_status == status and says in payload["error"]


def test_bad_batches_and_bad_handle_calls_do_not_hurt_the_replica(served):
    config, _, _, handle = served
    status, payload = post(
        config, "/retrieve_batch", json.dumps({"observations": ["x"] * 65, "task_types": ["pick"] * 65})
    )
    assert status == 413 and "at most 64" in payload["error"]
    status, payload = post(config, "/retrieve_batch", json.dumps({"observations": ["x", "y"], "task_types": ["pick"]}))
    assert status == 422 and "2 observations but 1 task_types" in payload["error"]
    with pytest.raises(Exception, match="k_warnings"):
        handle.retrieve.remote({"observation": FRIDGE, "task_type": "pick", "k_warnings": -1}).result()
    assert (
        handle.retrieve.remote({"observation": FRIDGE, "task_type": "pick", "k_strategies": 1}).result()["source"]
        == "cluster"
    )


def test_a_new_library_version_is_served_on_the_next_request(served):
    config, library, publisher, handle = served
    library.admit([candidate("Check the freezer drawer of the fridge too.", 0.95, observation=FRIDGE)], {STRATEGY: 1})
    publisher.publish_delta(library.commit())
    answer = handle.retrieve.remote(
        {"observation": FRIDGE, "task_type": "pick", "k_strategies": 1, "k_warnings": 0}
    ).result()
    assert (
        answer["library_version"] == 2
        and answer["experiences"][0]["text"] == "Check the freezer drawer of the fridge too."
    )
    status, payload = post(
        config,
        "/retrieve",
        json.dumps({"observation": FRIDGE, "task_type": "pick", "k_strategies": 1, "k_warnings": 0}),
    )
    assert status == 200 and payload == answer
