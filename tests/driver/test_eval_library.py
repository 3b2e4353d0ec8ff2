"""`slea eval` with the library: a run's snapshot is served on a real local Ray Serve for the evaluation."""

import asyncio
import os

import pytest
from ray import serve

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the embedding model ships in a pip package

from actors.engines.base import SamplingSettings  # noqa: E402
from actors.engines.transformers_engine import TransformersEngine  # noqa: E402
from actors.envs.registry import make_env  # noqa: E402
from actors.envs.tasks import panel_tasks  # noqa: E402
from driver.eval_library import eval_library  # noqa: E402
from driver.evaluate import evaluate_engine  # noqa: E402
from library.embedding import Embedder  # noqa: E402
from library.experience import STRATEGY, WARNING, Candidate  # noqa: E402
from library.persistence import snapshot_text, write_snapshot  # noqa: E402
from library.state import Library  # noqa: E402
from slea.config import load_config  # noqa: E402
from slea.models import tiny_model  # noqa: E402


@pytest.mark.slow
def test_with_library_rows_retrieve_from_the_runs_snapshot(tmp_path):
    config = load_config(
        None,
        [
            "envs.name=frozenlake",
            "envs.panel_size=2",
            "envs.max_steps=2",
            "run.id=evallib",
            "library.warmup_versions=0",
            "library.warmup_experiences=0",
            "ray.num_cpus=2",
        ],
    )
    env = make_env("frozenlake", max_steps=2)
    tasks = panel_tasks(env, "default", size=2)
    model, tokenizer = tiny_model(seed=4)
    library = Library(config.library, Embedder(), tokenizer)
    candidates = []
    for task in tasks:  # lessons cued by each panel task's own first board
        board = env.reset(task).observation.anchor_obs
        candidates += [
            Candidate(
                STRATEGY, "method", "Step around the O holes towards G.", "", task.task_type, [board], 0.9, ["e1"]
            ),
            Candidate(WARNING, "mistake", "Walking onto O ends the episode.", "", task.task_type, [board], 0.8, ["e2"]),
        ]
    library.admit(candidates, {STRATEGY: 10, WARNING: 5})
    library.commit()
    write_snapshot(tmp_path, snapshot_text(library, []), library.version)

    engine = TransformersEngine(model, tokenizer, SamplingSettings(max_new_tokens=6), max_batch=16)
    try:
        with eval_library(config, tmp_path) as (retrieval, note):
            assert retrieval is not None and "served for this evaluation" in note and "experiences)" in note
            report = evaluate_engine(
                engine, config, samples_per_task=2, retrieval=retrieval, library_note=note, out_dir=tmp_path / "eval"
            ).report
            # Where Ray is already up (as inside `slea train`), the running app is used, and left running.
            with eval_library(config, None) as (running, running_note):
                assert running is not None and running_note == "app 'slea-library' running on this process's Ray"
                answer = asyncio.run(running.retrieve(env.reset(tasks[0]).observation.anchor_obs, tasks[0].task_type))
                assert answer.hit and {e.zone for e in answer.experiences} == {"strategy", "warning"}
            assert serve.status().applications["slea-library"].status == "RUNNING"
    finally:
        engine.close()
    rows = {(row["decoding"], row["library"]): row for row in report["rows"]}
    assert all(row["available"] for row in rows.values())
    assert rows[("sampled", True)]["episodes"] == 4 and rows[("greedy", True)]["episodes"] == 2
    assert report["retrievals"] > 0 and report["retrieval_misses"] == 0
    assert rows[("sampled", True)]["injected_step_fraction"] == pytest.approx(1.0)
    assert rows[("greedy", True)]["injected_step_fraction"] == pytest.approx(1.0)
    assert rows[("sampled", False)]["injected_step_fraction"] == 0.0


def test_no_snapshot_and_no_library_are_reported_not_played(tmp_path):
    config = load_config(None, ["envs.name=frozenlake"])
    with eval_library(config, tmp_path) as (retrieval, note):
        assert retrieval is None and note.startswith(f"unavailable (run directory {tmp_path} has no library snapshot")
    with eval_library(config, None) as (retrieval, note):
        assert retrieval is None and "no run directory given" in note
    grpo = load_config(None, ["run.preset=grpo"])
    with eval_library(grpo, tmp_path) as (retrieval, note):
        assert retrieval is None and "library.enabled false" in note
