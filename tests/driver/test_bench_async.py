"""`slea bench async`: the step breakdown and the speedup's attribution, by hand; then the real command."""

import json
import subprocess
import sys

import pytest

from driver.bench_async import StepBreakdown, attribute_speedup, explain, overlap_bound, step_breakdown

SLEA = [sys.executable, "-m", "driver.cli"]


def test_overlap_bound_hides_the_shorter_phase_behind_the_longer():
    assert overlap_bound(6.0, 4.0) == pytest.approx(10.0 / 6.0)
    assert overlap_bound(3.0, 3.0) == 2.0  # equal phases: the most overlap can ever give
    assert overlap_bound(0.0, 5.0) == 1.0  # nothing to hide
    with pytest.raises(ValueError, match="must be >= 0"):
        overlap_bound(-1.0, 2.0)


def breakdown(s_per_step, busy, train):
    return StepBreakdown(
        s_per_step=s_per_step,
        train_s=train,
        learner_wait_s=0.0,
        learner_other_s=0.0,
        actor_busy_s=busy,
        actor_idle_s=s_per_step - busy,
        actor_throttled_s=0.0,
    )


def test_the_factors_multiply_back_to_the_speedup():
    # sync: g = 6, t = 4, step 12 (2 s of hand-offs); async step 4.
    factors = attribute_speedup(breakdown(12.0, busy=6.0, train=4.0), breakdown(4.0, busy=4.0, train=3.0))
    assert factors == {
        "speedup": 3.0,
        "overlap_bound": pytest.approx(1.667, abs=1e-3),
        "sync_overhead": 1.2,
        "beyond_overlap": 1.5,
    }  # 12/4; 10/6; 12/10; 6/4
    assert factors["overlap_bound"] * factors["sync_overhead"] * factors["beyond_overlap"] == pytest.approx(
        3.0, abs=0.01
    )
    line = explain(factors)
    assert line.startswith(
        "speedup 3.00 = overlap bound 1.67 x synchronous hand-off overhead 1.20 x 1.50 beyond overlap"
    )
    assert "slowest episode" in line
    imperfect = explain(attribute_speedup(breakdown(10.0, busy=6.0, train=4.0), breakdown(8.0, busy=8.0, train=4.0)))
    assert "0.75 beyond overlap (imperfect overlap" in imperfect  # max(6, 4) / 8


def test_step_breakdown_reads_the_trace_and_the_metrics_lines():
    # 1 warm-up step, then steps 2..4 published at 10, 20, 32: 2 measured intervals, 11 s/step.
    trace = [{"at": at} for at in (0.0, 10.0, 20.0, 32.0)]
    lines = [
        {
            "step": 1,
            "time": 1.0,
            "learner/step_seconds": 9.0,
            "learner/wait_seconds": 50.0,
            "actors/busy_s": 0.0,
            "actors/throttled_s": 0.0,
        },
        {
            "step": 2,
            "time": 11.0,
            "learner/step_seconds": 4.0,
            "learner/wait_seconds": 5.0,
            "actors/busy_s": 6.0,
            "actors/throttled_s": 3.0,
        },
        {
            "step": 3,
            "time": 21.0,
            "learner/step_seconds": 4.0,
            "learner/wait_seconds": 6.0,
            "actors/busy_s": 12.0,
            "actors/throttled_s": 7.0,
        },
        {
            "step": 4,
            "time": 33.0,
            "learner/step_seconds": 5.0,
            "learner/wait_seconds": 6.0,
            "actors/busy_s": 99.0,
            "actors/throttled_s": 99.0,
        },
        {"step": 3, "time": 40.0, "eval/success_rate": 0.5},  # not a learner line: ignored
    ]
    measured = step_breakdown(trace, lines, warmup_steps=1)
    # train, wait: means over steps 3 and 4; actors: lines of steps 2..3 (the last line is left out),
    # busy 6 s and throttled 4 s in 10 s of wall time, i.e. 0.6 and 0.4 of an 11 s step.
    assert measured == StepBreakdown(
        s_per_step=11.0,
        train_s=4.5,
        learner_wait_s=6.0,
        learner_other_s=0.5,
        actor_busy_s=6.6,
        actor_idle_s=4.4,
        actor_throttled_s=4.4,
    )
    with pytest.raises(RuntimeError, match="leave 1 measured after 2 warm-up steps"):
        step_breakdown(trace, lines, warmup_steps=2)


@pytest.mark.slow
def test_bench_async_tiny_prints_the_breakdown_and_its_attribution():
    result = subprocess.run(
        [*SLEA, "bench", "async", "--json", "--model", "tiny", "--steps", "2", "--warmup", "1", "--timeout", "900"],
        capture_output=True,
        text=True,
        timeout=1000,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["measured_steps"] == 2 and figures["warmup_steps"] == 1 and figures["learner_steps"] == 4
    assert figures["speedup"] == pytest.approx(figures["sync_s_per_step"] / figures["async_s_per_step"], rel=0.02)
    for mode in ("sync", "async"):
        steps = figures[mode]
        assert steps["s_per_step"] > 0 and steps["train_s"] > 0 and steps["actor_busy_s"] > 0
        assert steps["train_s"] + steps["learner_wait_s"] + steps["learner_other_s"] == pytest.approx(
            steps["s_per_step"], abs=0.01
        )
    # The synchronous actors wait while the learner trains: their throttled time is most of a training step.
    assert figures["sync"]["actor_throttled_s"] > 0.5 * figures["sync"]["train_s"]
    assert figures["overlap_bound"] == pytest.approx(
        overlap_bound(figures["sync"]["actor_busy_s"], figures["sync"]["train_s"]), abs=0.01
    )
    product = figures["overlap_bound"] * figures["sync_overhead"] * figures["beyond_overlap"]
    assert product == pytest.approx(figures["speedup"], rel=0.03)
    assert figures["attribution"].startswith(f"speedup {figures['speedup']:.2f} = overlap bound")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--steps", "--steps must be at least 2 (the actors' window spans steps - 1 intervals), not 1"),
        ("--warmup", "--warmup must be at least 1 (the first step includes loading the model), not 0"),
    ],
)
def test_bench_async_refuses_too_few_measured_or_warm_up_steps(flag, message):
    value = "1" if flag == "--steps" else "0"
    result = subprocess.run(
        [*SLEA, "bench", "async", "--model", "tiny", flag, value], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"slea bench async: {message}"


@pytest.mark.slow  # slea train starts Ray and the tiny model before the deadline stops it
def test_a_run_past_the_deadline_is_stopped_with_a_clear_error():
    result = subprocess.run(
        [*SLEA, "bench", "async", "--json", "--model", "tiny", "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "slea bench async: the sync run did not finish 10 learner steps before the benchmark's deadline"
    )
    assert last.endswith("measure fewer --steps, or give it longer with --timeout")
