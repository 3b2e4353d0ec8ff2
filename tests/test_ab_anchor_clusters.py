"""A/B groups under `learner.anchor: cluster`: both halves record the library cluster of each step,
so a state lands in one anchor group whichever half reached it.

Real components end to end on the actor side: the library's Ray Serve app (following a writer's
snapshot in a real Redis), the actors' batched retrieval client, frozenlake and the tiny model
playing through `play_episode`, and the learner's own `anchor_keys`.
"""

import asyncio
import os

import pytest
import ray
import redis
from ray import serve

from actors.engines.base import SamplingSettings
from actors.engines.transformers_engine import TransformersEngine
from actors.envs.registry import make_env
from actors.episode import EpisodeSpec, play_episode
from actors.prompts import PromptBuilder
from actors.retrieval_client import RetrievalClient
from learner.learner import anchor_keys
from slea.config import SleaConfig
from slea.models import tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: the embedding model ships in a pip package

from library.embedding import Embedder  # noqa: E402
from library.experience import STRATEGY, WARNING, Candidate  # noqa: E402
from library.persistence import snapshot_text  # noqa: E402
from library.service import start_serve_app  # noqa: E402
from library.state import Library  # noqa: E402
from library.sync import Publisher  # noqa: E402

pytestmark = pytest.mark.slow  # Ray, Serve, MiniLM and the tiny model

LESSON = "Walk around the holes, never through them."
BUDGET = 3


@pytest.fixture(scope="module")
def lake_library(redis_server, policy_tokenizer):
    """A frozenlake task, a library past warm-up holding one lesson for its start board, and the app serving it."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    config = SleaConfig.model_validate(
        {"run": {"id": "abclusters"}, "library": {"warmup_versions": 0, "warmup_experiences": 0, "http_port": 0}}
    )
    env = make_env("frozenlake", max_steps=BUDGET)
    task = env.make_task(0, split="train")
    start_board = env.reset(task).observation.anchor_obs
    library = Library(config.library, Embedder(), policy_tokenizer=policy_tokenizer)
    library.admit(
        [Candidate(STRATEGY, "method", LESSON, "", task.task_type, [start_board], 0.9, ["ep"])],
        {STRATEGY: 1, WARNING: 0},
    )
    library.commit()
    Publisher(client, config.run.id).start(snapshot_text(library, []))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    handle = start_serve_app(config, redis_server.url)
    yield task, handle
    serve.shutdown()
    ray.shutdown()
    client.close()


def test_both_halves_record_the_cluster_and_only_the_a_half_is_shown_experiences(lake_library):
    task, handle = lake_library
    model, tokenizer = tiny_model(seed=1)
    engine = TransformersEngine(model, tokenizer, SamplingSettings(temperature=1.0, max_new_tokens=8), max_batch=4)
    retrieval = RetrievalClient(k_strategies=2, k_warnings=1, max_tokens=200, timeout_s=60, handle=handle)
    builder = PromptBuilder(tokenizer)

    async def play_group():
        halves = [
            EpisodeSpec("abclusters", task, "g", "g-0", BUDGET, True, "step"),
            EpisodeSpec("abclusters", task, "g", "g-1", BUDGET, False, "step", hidden_retrieval=True),
        ]
        results = await asyncio.gather(
            *(
                play_episode(
                    spec,
                    make_env("frozenlake", max_steps=BUDGET),
                    engine,
                    builder,
                    retrieval,
                    lambda _record: None,
                    keep_records=True,
                )
                for spec in halves
            )
        )
        return [result.records for result in results]

    try:
        a_records, b_records = asyncio.run(play_group())
    finally:
        retrieval.close()
        engine.close()
    # The tiny model's actions are invalid or moves; step 0 is the start board in both halves.
    a_start, b_start = a_records[0], b_records[0]
    assert a_start.anchor_obs == b_start.anchor_obs and a_start.anchor_cluster
    assert b_start.anchor_cluster == a_start.anchor_cluster
    rows = a_records + b_records
    keys = anchor_keys(rows, "cluster")
    for board in {r.anchor_obs for r in rows}:
        assert len({key for key, r in zip(keys, rows) if r.anchor_obs == board}) == 1, board  # one state, one group
    assert all(r.anchor_cluster for r in rows if r.anchor_obs == a_start.anchor_obs)
    # The A half is shown the lesson; the B half is shown nothing and records nothing as injected.
    assert a_start.with_experience and a_start.experience_ids and a_start.library_version >= 1
    assert LESSON in tokenizer.decode(a_start.prompt_ids)
    for record in b_records:
        assert not record.with_experience and record.experience_ids == [] and record.library_version == -1
        assert LESSON not in tokenizer.decode(record.prompt_ids) and len(record.teacher_prompt_ids) == 0
