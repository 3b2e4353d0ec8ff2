"""The evaluation panel: summaries by hand, and a real panel played by the tiny model into a report."""

import asyncio
import json

import numpy as np
import pytest
from matplotlib.image import imread

from actors.engines.base import SamplingSettings
from actors.engines.transformers_engine import TransformersEngine
from actors.envs.registry import make_env
from actors.envs.tasks import panel_tasks
from actors.evaluation.panel import (
    EpisodeOutcome,
    PanelSettings,
    check_settings,
    default_budgets,
    default_ks,
    play_panel,
    played_library_modes,
    summarise_mode,
)
from actors.evaluation.report import write_report
from actors.prompts import PromptBuilder
from slea.models import tiny_model


def outcome(task, task_type, sample, steps, success, invalid=0, injected=0, decoding="sampled", library=False):
    return EpisodeOutcome(task, task_type, decoding, library, sample, steps, success, invalid, injected, float(success))


def test_a_row_summarises_its_episodes_by_hand():
    settings = PanelSettings(samples_per_task=2, step_budget=10, temperature=1.0, ks=[1, 2], budgets=[3, 10])
    outcomes = [
        outcome("a", "pick", 0, 3, True, invalid=1),
        outcome("a", "pick", 1, 10, False, invalid=2),
        outcome("b", "clean", 0, 7, True),
        outcome("b", "clean", 1, 10, False),
        outcome("a", "pick", 0, 2, True, decoding="greedy"),  # another row: ignored
    ]
    row = summarise_mode(outcomes, "sampled", False, settings, library_available=False, library_note="none")
    assert row.available and row.episodes == 4 and row.success_rate == 0.5
    assert row.success_by_task_type == {"clean": 0.5, "pick": 0.5}
    assert row.mean_steps == 30 / 4 and row.mean_steps_success == 5.0
    assert row.invalid_action_rate == 3 / 30 and row.injected_step_fraction == 0.0
    # T=3: only task a's win counts (c = 1, 0); T=10: c = 1, 1. Pass@1 = c/2, Pass@2 = 1 when c >= 1.
    np.testing.assert_allclose(row.pass_grid, [[0.25, 0.5], [0.5, 1.0]])
    unavailable = summarise_mode(
        outcomes, "sampled", True, settings, library_available=False, library_note="no snapshot"
    )
    assert (
        not unavailable.available and unavailable.note == "not played: no snapshot" and unavailable.success_rate is None
    )


def test_defaults_and_settings_checks():
    assert default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6] and default_ks(1) == [1]
    assert default_budgets(20) == [5, 10, 20] and default_budgets(2) == [1, 2]
    with pytest.raises(ValueError, match="episodes per task"):
        check_settings(PanelSettings(samples_per_task=2, step_budget=10, temperature=1.0, ks=[4], budgets=[10]))
    with pytest.raises(ValueError, match="step budget"):
        check_settings(PanelSettings(samples_per_task=2, step_budget=10, temperature=1.0, ks=[1], budgets=[20]))


@pytest.fixture(scope="module")
def engine():
    model, tokenizer = tiny_model(seed=1)
    engine = TransformersEngine(model, tokenizer, SamplingSettings(temperature=1.0, max_new_tokens=8), max_batch=16)
    yield engine
    engine.close()


@pytest.mark.slow
def test_tiny_model_plays_a_frozenlake_panel_into_a_consistent_report(engine, tmp_path):
    env = make_env("frozenlake", max_steps=3)
    tasks = panel_tasks(env, "default", size=3)
    settings = PanelSettings(samples_per_task=2, step_budget=3, temperature=1.0, ks=[1, 2], budgets=[1, 3])
    builder = PromptBuilder(engine.tokenizer, history_length=1)
    batches = []
    generate_batch = engine.generate_batch
    engine.generate_batch = lambda prompts: batches.append(len(prompts)) or generate_batch(prompts)
    heard = []
    try:
        result = asyncio.run(
            play_panel(
                engine,
                lambda: make_env("frozenlake", max_steps=3),
                tasks,
                builder,
                None,
                settings,
                "no library in this test",
                on_episode=lambda played, in_all: heard.append((played, in_all)),
            )
        )
    finally:
        del engine.generate_batch
    assert engine.sampling.temperature == 1.0  # restored after the greedy phase
    assert max(batches) == 6  # the sampled phase's episodes share each batched generation

    sampled = [o for o in result.outcomes if o.decoding == "sampled"]
    greedy = [o for o in result.outcomes if o.decoding == "greedy"]
    assert len(sampled) == 3 * 2 and len(greedy) == 3 and not any(o.library for o in result.outcomes)
    assert sorted({(o.task_id, o.sample) for o in sampled}) == sorted((t.task_id, s) for t in tasks for s in (0, 1))
    assert all(1 <= o.steps <= 3 for o in result.outcomes)
    assert heard == [(n, 9) for n in range(1, 10)]  # each finished episode, out of 3 tasks x (2 sampled + 1 greedy)

    files = write_report(result, {"model": "tiny", "env": "frozenlake", "panel": "default"}, tmp_path)
    report = json.loads(files["json"].read_text())
    rows = {(row["decoding"], row["library"]): row for row in report["rows"]}
    assert set(rows) == {("sampled", False), ("greedy", False), ("sampled", True), ("greedy", True)}
    for (decoding, _), row in rows.items():
        if not row["available"]:
            assert row["note"] == "not played: no library in this test"
            continue
        mine = [e for e in report["episodes"] if e["decoding"] == decoding]
        assert row["episodes"] == len(mine)
        assert row["success_rate"] == pytest.approx(np.mean([e["success"] for e in mine]))
        assert row["mean_steps"] == pytest.approx(np.mean([e["steps"] for e in mine]))
        assert set(row["success_by_task_type"]) == {t.task_type for t in tasks}
    assert not rows[("sampled", True)]["available"] and not rows[("greedy", True)]["available"]
    grid = np.array(rows[("sampled", False)]["pass_grid"])
    assert grid.shape == (2, 2) and grid[0, -1] == pytest.approx(rows[("sampled", False)]["success_rate"])
    assert report["tasks"] == 3 and sum(report["task_types"].values()) == 3
    assert report["generated_tokens"]["sampled"] > 0

    text = files["markdown"].read_text()
    assert "| sampled | without | 6 |" in text and "not played: no library in this test" in text
    assert "| k \\ T | 1 | 3 |" in text
    header = next(line for line in text.splitlines() if line.startswith("| decoding"))
    for line in text.splitlines():
        if line.startswith("| sampled") or line.startswith("| greedy"):
            assert line.count("|") == header.count("|"), line
    for name in ("success_plot", "pass_plot"):
        image = imread(files[name])
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_without_greedy_only_the_sampled_rows_are_played(engine):
    env = make_env("frozenlake", max_steps=3)
    tasks = panel_tasks(env, "default", size=2)
    settings = PanelSettings(samples_per_task=1, step_budget=3, temperature=1.0, ks=[1], budgets=[3], greedy=False)
    heard = []
    result = asyncio.run(
        play_panel(
            engine,
            lambda: make_env("frozenlake", max_steps=3),
            tasks,
            PromptBuilder(engine.tokenizer, history_length=1),
            None,
            settings,
            "no library in this test",
            on_episode=lambda played, in_all: heard.append((played, in_all)),
        )
    )
    assert {o.decoding for o in result.outcomes} == {"sampled"} and heard[-1] == (2, 2)
    greedy = [row for row in result.rows if row.decoding == "greedy"]
    assert greedy and all(not row.available and row.note == "not played: greedy decoding is off" for row in greedy)


def test_the_policy_alone_is_dropped_only_beside_a_library():
    pair = PanelSettings(samples_per_task=1, step_budget=3, temperature=1.0, ks=[1], budgets=[3])
    deployed_only = PanelSettings(
        samples_per_task=1, step_budget=3, temperature=1.0, ks=[1], budgets=[3], policy_alone=False
    )
    assert played_library_modes(pair, has_library=True) == [False, True]
    assert played_library_modes(deployed_only, has_library=True) == [True]
    # No library (no preset with one, or the base policy before the first update): the policy alone.
    assert played_library_modes(pair, has_library=False) == played_library_modes(deployed_only, False) == [False]
