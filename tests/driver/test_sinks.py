"""The metric sinks of `monitoring.sinks`: W&B offline (no network), the choice from config."""

from pathlib import Path

import pytest
import wandb
from wandb_offline import offline_run

from driver.run_outputs import RunRecorder, read_metrics
from driver.sinks import WANDB_DIR, WANDB_RUN_ID_FILE, TensorBoardSink, WandbSink, open_sinks
from slea.config import ConfigError, load_config


@pytest.fixture(autouse=True)
def private_wandb_home(tmp_path, monkeypatch):
    """wandb keeps settings and caches under the home directory: give it the test's own, and no mode
    from the environment (a test that wants $WANDB_MODE sets it)."""
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    wandb.teardown()  # wandb reads the environment once per process setup: the next test sets it up afresh


def config_for(run_dir: Path, *overrides: str):
    return load_config("configs/local.yaml", [f"run.dir={run_dir.parent}", f"run.id={run_dir.name}", *overrides])


def offline_logs(run_dir: Path) -> list[Path]:
    """Each start's run log, oldest first (the directory names begin with the start time)."""
    return sorted((run_dir / WANDB_DIR).glob("offline-run-*/run-*.wandb"), key=lambda path: path.parent.name)


def test_wandb_offline_records_each_step_and_a_resume_continues_the_same_run(tmp_path):
    run_dir = tmp_path / "wb-run"
    config = config_for(run_dir, "monitoring.sinks=[jsonl, wandb]", "monitoring.wandb_mode=offline")
    with RunRecorder(run_dir, sinks=open_sinks(config, run_dir), plots=False) as recorder:
        for step in (1, 2, 3):
            recorder.record(
                step, {"learner/loss": 1.0 / step, "actors/success_rate": 0.25 * step, "run/preset": "slea"}
            )
        recorder.record(2, {"eval/success_rate": 0.5})  # a held-out evaluation of step 2 arriving after step 3
    run_id = (run_dir / WANDB_DIR / WANDB_RUN_ID_FILE).read_text().strip()
    assert run_id.startswith("wb-run-")

    [first] = offline_logs(run_dir)
    assert first.name == f"run-{run_id}.wandb"
    run, logged_config, history = offline_run(first)
    assert (run.run_id, run.display_name, run.project) == (run_id, "wb-run", "slea-rl")
    assert logged_config["run"]["id"] == "wb-run" and logged_config["monitoring"]["sinks"] == ["jsonl", "wandb"]
    rows = [{key: row[key] for key in row if not key.startswith("_")} for row in history]
    assert rows == [
        {"learner_step": 1, "learner/loss": 1.0, "actors/success_rate": 0.25},
        {"learner_step": 2, "learner/loss": 0.5, "actors/success_rate": 0.5},
        {"learner_step": 3, "learner/loss": 1.0 / 3, "actors/success_rate": 0.75},
        {"learner_step": 2, "eval/success_rate": 0.5},
    ]  # numbers only ("run/preset" stays in metrics.jsonl), each against its learner step

    # `slea train --resume` reopens the same run directory: the same W&B run id goes on.
    with RunRecorder(run_dir, sinks=open_sinks(config, run_dir), plots=False) as recorder:
        recorder.record(4, {"learner/loss": 0.2})
    assert len(offline_logs(run_dir)) == 2
    resumed, _, history = offline_run(offline_logs(run_dir)[1])
    assert resumed.run_id == run_id
    assert [(row["learner_step"], row["learner/loss"]) for row in history] == [(4, 0.2)]
    assert [entry["step"] for entry in read_metrics(run_dir)] == [1, 2, 3, 4]  # metrics.jsonl is written as ever


def test_wandb_mode_null_follows_WANDB_MODE_and_a_new_run_gets_its_own_id(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    ids = []
    for parent in ("first", "second"):  # two runs of the same run id, one after the other
        run_dir = tmp_path / parent / "same-id"
        sink = WandbSink(run_dir, name="same-id", project="p", mode=None)
        sink.record(1, {"learner/loss": 1.0}, walltime=0.0)
        sink.close()
        [log] = offline_logs(run_dir)
        assert offline_run(log)[0].run_id == sink.run_id
        ids.append(sink.run_id)
    assert ids[0] != ids[1]  # a reused run id never appends to the earlier W&B run


def test_run_ids_that_wandb_would_reject_are_made_safe(tmp_path):
    sink = WandbSink(tmp_path / "run", name="exp#3?ablation%", project="p", mode="offline")
    sink.close()
    assert sink.run_id.startswith("exp-3-ablation--") and offline_logs(tmp_path / "run")


def test_online_without_credentials_is_a_config_error_that_offers_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc holding a key
    with pytest.raises(ConfigError, match=r"W&B refused to start the run: No API key configured.*wandb_mode: offline"):
        WandbSink(tmp_path / "run", name="run", project="p", mode="online")


def test_the_configured_sinks_are_opened(tmp_path):
    run_dir = tmp_path / "run"
    assert [type(sink) for sink in open_sinks(config_for(run_dir), run_dir)] == [TensorBoardSink]  # the default
    assert open_sinks(config_for(run_dir, "monitoring.sinks=[jsonl]"), run_dir) == []
