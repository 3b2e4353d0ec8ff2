"""Held-out evaluation during training: the report -> metrics mapping and the request schedule.

The evaluator itself (engine, registry weights, panel) runs in tests/test_end_to_end.py.
"""

import threading
import time

import pytest
import ray

from driver.train_eval import HEADLINE, EvalSchedule, eval_metrics


def _row(decoding, library, success, available=True, by_type=None):
    return {
        "decoding": decoding,
        "library": library,
        "available": available,
        "success_rate": success,
        "mean_steps": 5.0,
        "invalid_action_rate": 0.25,
        "success_by_task_type": by_type or {},
    }


def test_headline_is_sampled_success_with_the_library_when_the_run_has_one():
    report = {
        "policy_version": 7,
        "rows": [
            _row("sampled", False, 0.25),
            _row("greedy", False, 0.5),
            _row("sampled", True, 0.75, by_type={"pick": 1.0, "look": 0.5}),
            _row("greedy", True, 0.0),
        ],
    }
    metrics = eval_metrics(report, with_library=True)
    assert metrics[HEADLINE] == 0.75
    assert metrics[f"{HEADLINE}/pick"] == 1.0 and metrics[f"{HEADLINE}/look"] == 0.5
    assert metrics["eval/sampled/no_library/success_rate"] == 0.25
    assert metrics["eval/greedy/library/success_rate"] == 0.0
    assert metrics["eval/greedy/no_library/invalid_action_rate"] == 0.25
    assert metrics["eval/policy_version"] == 7


def test_without_a_library_the_headline_is_the_no_library_row_and_unplayed_rows_are_left_out():
    report = {
        "policy_version": 0,
        "rows": [
            _row("sampled", False, 0.125),
            _row("greedy", False, 0.0),
            _row("sampled", True, None, available=False),
            _row("greedy", True, None, available=False),
        ],
    }
    metrics = eval_metrics(report, with_library=False)
    assert metrics[HEADLINE] == 0.125
    assert not any("/library/" in key for key in metrics)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class GatedEvaluator:
    """Stands in for PanelEvaluator: each evaluation finishes only when the test opens the gate."""

    def __init__(self):
        self.gate = threading.Event()
        self.started: list[int] = []

    def evaluate(self, learner_step: int) -> dict:
        self.started.append(learner_step)
        self.gate.wait(30)
        self.gate.clear()
        if learner_step == 13:
            raise RuntimeError("the panel could not be played")
        return {HEADLINE: learner_step / 10}

    def open_gate(self) -> None:
        self.gate.set()

    def started_steps(self) -> list[int]:
        return list(self.started)

    def progress(self) -> tuple[int, int, int] | None:
        return (self.started[-1], 1, 2) if self.started else None


def _wait_until_started(evaluator) -> None:
    """The request is sent; the actor runs it a moment later (until then it has nothing to report)."""
    deadline = time.monotonic() + 30
    while not ray.get(evaluator.started_steps.remote()):
        assert time.monotonic() < deadline, "the evaluation never started"
        time.sleep(0.05)


def _finish_one(evaluator, schedule) -> list:
    evaluator.open_gate.remote()
    return schedule.poll(timeout_s=30)


def test_schedule_runs_one_at_a_time_and_a_newer_request_replaces_a_waiting_one(local_ray):
    evaluator = GatedEvaluator.options(max_concurrency=4).remote()
    schedule = EvalSchedule(evaluator, every=2)
    schedule.on_learner_step(0, final=True)
    schedule.on_learner_step(1)  # not a multiple of `every`: no request
    schedule.on_learner_step(2)  # waits behind step 0
    schedule.on_learner_step(4)  # replaces step 2 while it waits
    schedule.on_learner_step(4)  # asked once only
    assert schedule.poll() == [] and schedule.busy
    _wait_until_started(evaluator)
    assert schedule.progress() == (0, 1, 2)  # the running evaluation's own count
    assert _finish_one(evaluator, schedule)[0] == (0, {HEADLINE: 0.0})
    finished = _finish_one(evaluator, schedule)
    assert finished == [(4, {HEADLINE: 0.4})]
    assert ray.get(evaluator.started_steps.remote()) == [0, 4]
    assert not schedule.busy and schedule.progress() is None
    schedule.on_learner_step(5, final=True)  # the last step is evaluated whatever `every` says
    assert _finish_one(evaluator, schedule) == [(5, {HEADLINE: 0.5})]


def test_a_failed_evaluation_is_skipped_and_the_next_one_runs(local_ray):
    evaluator = GatedEvaluator.options(max_concurrency=4).remote()
    schedule = EvalSchedule(evaluator, every=1)
    schedule.on_learner_step(13)
    assert _finish_one(evaluator, schedule) == [] and schedule.failed == [13] and not schedule.busy
    schedule.on_learner_step(14)
    assert _finish_one(evaluator, schedule) == [(14, {HEADLINE: 1.4})]
