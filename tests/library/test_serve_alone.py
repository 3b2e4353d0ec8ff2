"""The library app comes up alone (issue 13, item 5), on a real Ray Serve and an empty Redis: the
replicas start and answer /healthz before any library exists, retrievals get 503 with the reason
(and the actors' client counts "unavailable", asking again only after a pause), and once a writer
publishes, the same replicas serve its library. An app set to follow the current run (the
RayService's) serves the library of whichever run's writer started last (issue 22, item 4)."""

import asyncio
import http.client
import json
import time

import pytest
import ray
from helpers import serve_http_port
from library_helpers import candidate, library_config
from prometheus_client import REGISTRY
from ray import serve

from actors.retrieval_client import HANDLE_RETRY_S, RetrievalClient
from library.consumer import LibraryWriter
from library.experience import STRATEGY, WARNING
from library.extraction.rules import RulesExtractor
from library.persistence import snapshot_text, write_snapshot
from library.retrieval import retrieve_batch
from library.service import start_serve_app
from library.state import Library
from slea.channels import CURRENT_LIBRARY_RUN_KEY, LIBRARY_APP, LibraryNotPublished
from slea.config import SleaConfig

pytestmark = pytest.mark.slow

FRIDGE = "You arrive at fridge 1. The fridge 1 is closed."
RUN = "alone"


def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=None if body is None else json.dumps(body))
    response = connection.getresponse()
    status, payload = response.status, json.loads(response.read())
    connection.close()
    return status, payload


def counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("slea_actor_retrieval_requests_total", {"outcome": outcome}) or 0.0


@pytest.fixture
def empty_redis_app(request, redis_client, redis_url):
    """The retrieval app deployed for run `alone` on a Redis that holds nothing at all; indirect
    parameter: library.follow ("run" unless given)."""
    follow = getattr(request, "param", "run")
    config = SleaConfig.model_validate(
        {"run": {"id": RUN}, "library": library_config(http_port=serve_http_port(), follow=follow).model_dump()}
    )
    assert not redis_client.keys("*")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    started = time.monotonic()
    start_serve_app(config, redis_url)  # returns once the app is RUNNING: its replicas started without a library
    up_s = time.monotonic() - started
    yield config, up_s
    serve.shutdown()
    ray.shutdown()


def published_run(
    config, run_id, redis_client, embedder, tokenizer, run_dir, lesson: str
) -> tuple[LibraryWriter, dict]:
    """A writer of run `run_id` started from a run directory whose library holds one strategy
    (`lesson`); returns it and the answer its library gives for the fridge observation."""
    run_config = config.model_copy(update={"run": config.run.model_copy(update={"id": run_id})})
    library = Library(config.library, embedder, tokenizer)
    library.admit([candidate(lesson, 0.9, observation=FRIDGE)], {STRATEGY: 10, WARNING: 5})
    library.commit()
    write_snapshot(run_dir, snapshot_text(library, []), library.version)
    writer = LibraryWriter(
        run_config, redis_client, run_dir, Library(config.library, embedder, tokenizer), RulesExtractor()
    )
    expected = retrieve_batch(library, [FRIDGE], ["pick"])[0]
    assert [e["text"] for e in expected["experiences"]] == [lesson]
    return writer, expected


@pytest.mark.parametrize("empty_redis_app", ["current"], indirect=True)
def test_an_app_following_the_current_run_serves_the_run_whose_writer_started_last(
    empty_redis_app, redis_client, embedder, policy_tokenizer, tmp_path
):
    """The RayService's app (library.follow=current) knows no run id in advance: it serves the run
    whose library writer started last on its Redis, and moves to the next run when that one's starts."""
    config, _ = empty_redis_app
    port, fridge = config.library.http_port, {"observation": FRIDGE, "task_type": "pick"}
    status, payload = request(port, "POST", "/retrieve", fridge)
    assert status == 503 and CURRENT_LIBRARY_RUN_KEY in payload["error"], payload
    writers = []
    try:
        for run_id, lesson in (
            ("cluster-a", "Open the fridge before looking inside it."),
            ("cluster-b", "Take the apple from the fridge."),
        ):
            writer, expected = published_run(
                config, run_id, redis_client, embedder, policy_tokenizer, tmp_path / run_id, lesson
            )
            writers.append(writer)
            assert redis_client.get(CURRENT_LIBRARY_RUN_KEY) == run_id.encode()
            assert request(port, "POST", "/retrieve", fridge) == (200, expected), run_id
            health = request(port, "GET", "/healthz")[1]
            assert (health["run"], health["library_version"]) == (run_id, 1)
            assert request(port, "GET", "/stats")[1]["run"] == run_id
    finally:
        for writer in writers:
            writer.stop_worker()


def test_the_app_is_up_before_any_library_and_serves_the_first_one_published(
    empty_redis_app, redis_client, embedder, policy_tokenizer, tmp_path
):
    config, up_s = empty_redis_app
    port = config.library.http_port
    print(f"app RUNNING on an empty Redis after {up_s:.1f} s")
    assert serve.status().applications["slea-library"].status == "RUNNING"

    status, health = request(port, "GET", "/healthz")
    assert status == 200 and health["ok"] is True and health["library_version"] is None
    fridge = {"observation": FRIDGE, "task_type": "pick"}
    for path, body in (("/retrieve", fridge), ("/retrieve_batch", {"observations": [FRIDGE], "task_types": ["pick"]})):
        status, payload = request(port, "POST", path, body)
        assert status == 503 and f"no library published yet for run {RUN}" in payload["error"], (path, payload)
    with pytest.raises(LibraryNotPublished):  # the evaluator's library listing says so instead of failing
        serve.get_app_handle(LIBRARY_APP).listing.remote(3).result(timeout_s=30)

    # The actors' client: counted as unavailable (not as errors), and not asked again for a while.
    client = RetrievalClient(k_strategies=2, k_warnings=1, max_tokens=200, timeout_s=5.0)
    unavailable, errors = counted("unavailable"), counted("error")
    first = asyncio.run(client.retrieve(FRIDGE, "pick"))
    second = asyncio.run(client.retrieve(FRIDGE, "pick"))
    assert not first.hit and not second.hit
    assert (counted("unavailable") - unavailable, counted("error") - errors) == (2, 0)

    # A writer starts (here from a run directory with a library in it) and publishes: served at once.
    library = Library(config.library, embedder, policy_tokenizer)
    library.admit(
        [
            candidate("Open the fridge before looking inside it.", 0.9, observation=FRIDGE),
            candidate("Never put the sponge in the fridge.", 0.7, zone=WARNING, level="mistake", observation=FRIDGE),
        ],
        {STRATEGY: 10, WARNING: 5},
    )
    library.commit()
    write_snapshot(tmp_path, snapshot_text(library, []), library.version)
    writer = LibraryWriter(
        config, redis_client, tmp_path, Library(config.library, embedder, policy_tokenizer), RulesExtractor()
    )
    try:
        expected = retrieve_batch(library, [FRIDGE], ["pick"])[0]
        assert expected["experiences"], "the published library should answer this observation"
        assert request(port, "POST", "/retrieve", fridge) == (200, expected)
        assert request(port, "GET", "/healthz")[1]["library_version"] == library.version == 1
        listing = serve.get_app_handle(LIBRARY_APP).listing.remote(3).result(timeout_s=30)
        assert listing.startswith(f"live library of run {RUN} (version 1)") and "Open the fridge" in listing
        time.sleep(HANDLE_RETRY_S)  # the client's pause after "unavailable"
        answered = asyncio.run(client.retrieve(FRIDGE, "pick"))
        assert answered.hit and [e.text for e in answered.experiences] == [e["text"] for e in expected["experiences"]]
    finally:
        client.close()
        writer.stop_worker()
