"""A run's outputs: JSON lines per learner step, the TensorBoard sink's events, PNG plots, learning curves."""

import json

import pytest
from matplotlib.image import imread
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from driver.run_outputs import RunRecorder, compare_runs, read_metrics, series
from driver.sinks import TensorBoardSink


def step_metrics(step: int) -> dict:
    return {
        "actors/success_rate": step / 10,
        "actors/success_rate/pick": step / 20,
        "actors/success_rate/clean": 0.1,
        "actors/episode_length": 20 - step,
        "library/size/strategy": 3 * step,
        "library/size/warning": step,
        "stream/lag/learner": 100 - step,
        "stream/lag/library": 5,
        "learner/loss": 0.5,
        "run/preset": "slea",
    }


def assert_png(path):
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_recorder_writes_lines_tensorboard_and_plots(tmp_path):
    with RunRecorder(tmp_path, sinks=[TensorBoardSink(tmp_path)], plot_every=2) as recorder:
        for step in range(1, 5):
            recorder.record(step, step_metrics(step))
        lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1, 2, 3, 4]
        assert lines[2]["library/size/strategy"] == 9 and lines[0]["run/preset"] == "slea" and lines[0]["time"] > 0
        assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
            "episode_length.png",
            "library_size.png",
            "stream_lag.png",
            "success_rate.png",
        ]  # drawn at step 2 and 4
    for png in (tmp_path / "plots").iterdir():
        assert_png(png)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "actors/success_rate/pick" in events.Tags()["scalars"] and "run/preset" not in events.Tags()["scalars"]
    assert [(e.step, e.value) for e in events.Scalars("stream/lag/learner")] == [(1, 99), (2, 98), (3, 97), (4, 96)]


def test_a_resumed_run_appends_and_later_lines_win(tmp_path):
    with RunRecorder(tmp_path, plots=False) as recorder:
        for step in (1, 2, 3):
            recorder.record(step, {"eval/success_rate": 0.1 * step})
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 4, "eval/succ')  # torn by a crash mid-write
    with RunRecorder(tmp_path, plots=False) as recorder:  # resumed from the step-2 checkpoint
        recorder.record(3, {"eval/success_rate": 0.5})
        recorder.record(4, {"eval/success_rate": 0.6})
    assert series(read_metrics(tmp_path), "eval/success_rate") == {
        "eval/success_rate": ([1, 2, 3, 4], [0.1, 0.2, 0.5, 0.6])
    }
    assert not (tmp_path / "plots").exists() and not (tmp_path / "tensorboard").exists()


def test_learning_curves_compare_runs_on_held_out_success(tmp_path):
    for label, rate in (("slea", 0.2), ("grpo", 0.1)):
        with RunRecorder(tmp_path / label, plots=False) as recorder:
            for step in range(0, 30, 10):
                recorder.record(step, {"eval/success_rate": rate * step / 10, "learner/loss": 1.0})
                recorder.record(step + 1, {"learner/loss": 0.9})  # steps without an evaluation
    table, out = compare_runs([tmp_path / "slea", tmp_path / "grpo"], tmp_path / "curves.png")
    assert_png(out)
    assert table.splitlines()[2:] == ["| 0 | 0.000 | 0.000 |", "| 10 | 0.200 | 0.100 |", "| 20 | 0.400 | 0.200 |"]
    with RunRecorder(tmp_path / "empty", plots=False) as recorder:
        recorder.record(1, {"learner/loss": 1.0})
    with pytest.raises(ValueError, match="no 'eval/success_rate'"):
        compare_runs([tmp_path / "empty"], tmp_path / "none.png")


def test_an_evaluation_line_merges_into_its_learner_step(tmp_path):
    with RunRecorder(tmp_path, plots=False) as recorder:
        recorder.record(5, {"learner/loss": 0.3, "actors/success_rate": 0.25})
        recorder.record(5, {"eval/success_rate": 0.5})  # the held-out evaluation of step 5 arrives later
    assert [(entry["step"], entry["learner/loss"], entry["eval/success_rate"]) for entry in read_metrics(tmp_path)] == [
        (5, 0.3, 0.5)
    ]


def test_compare_tabulates_each_run_by_learner_step_and_plots_them(tmp_path):
    for run_id, preset, rates in (("a", "slea", {0: 0.1, 5: 0.3}), ("b", "grpo", {0: 0.1, 4: 0.2})):
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "config.yaml").write_text(f"run:\n  id: {run_id}\n  preset: {preset}\n")
        with RunRecorder(tmp_path / run_id, plots=False) as recorder:
            for step, rate in rates.items():
                recorder.record(step, {"eval/success_rate": rate})
    table, png = compare_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "curves.png")
    assert table.splitlines() == [
        "| learner step | a (slea) | b (grpo) |",
        "|---|---|---|",
        "| 0 | 0.100 | 0.100 |",
        "| 4 | - | 0.200 |",
        "| 5 | 0.300 | - |",
    ]
    assert_png(png)
