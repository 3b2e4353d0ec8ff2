"""`slea bench async`: what the actor-learner overlap buys, against a synchronous baseline, and why.

The same config runs twice through `slea train` (a subprocess each), the whole system with nothing
simulated: once as normal (actors keep playing while the learner trains, bounded by
`max_staleness`) and once with `actors.synchronous` (the actors play exactly one batch per policy
version and wait while the learner trains on it; the learner waits for that full batch). Both runs
take the same number of learner steps. The synchronous mode is as lean as a synchronous trainer:
each phase computes on every core (slea/cpu_threads.py), actors fetch new weights as soon as
they wait (actors/worker.py: a 50 ms poll, under 1% of a step), the learner's stream read
returns as entries arrive, and no checkpoint falls inside the measured steps.

Where a learner step's time goes, per mode, from what `slea train` writes anyway:
- seconds per step: between consecutive published versions (learner/trained_groups.jsonl);
- training `train_s` and waiting for complete groups `learner_wait_s`: the learner's
  `step_seconds` and `wait_seconds` (metrics.jsonl); `learner_other_s` is the rest (advantages,
  publishing the weights);
- the actors' wall time with a group in play `actor_busy_s` (generation, env resets and steps,
  prompts) and held back by the gate `actor_throttled_s` (synchronous: waiting for the next
  version): the growth of "actors/busy_s" and "actors/throttled_s" between two metrics.jsonl lines
  over the time between them, times seconds per step. That window ends one line early: the last
  line is written after the learner's final checkpoint, while the actors already idle.

Overlap alone gives at most (g + t) / max(g, t) with the synchronous g (actor busy) and t (train):
the async step can at best hide the shorter phase behind the longer one. The speedup splits
exactly into that bound, times the synchronous step's overhead beyond g + t (hand-offs), times
max(g, t) over the async step: above 1 when the overlapped actor plays a batch faster than the
synchronous one (it never waits for a batch's slowest episode), below 1 when the overlap is
imperfect (the two processes slow each other down on shared cores).

The first `warmup_steps` steps are left out: they include model loading and, in the overlapped
run, the groups the actors played while the learner was still starting up. What is measured is
the steady state. Each run has a deadline; a run that misses it is stopped (Ctrl-C, then killed
with its whole process group) and the benchmark fails saying which run and how far it got.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from driver.run_outputs import METRICS_FILE

TINY = "tiny"  # model name meaning the randomly initialised tiny test model (slea.models.tiny_model)
DEFAULT_MODEL = "smollm2-135m-instruct"
STOP_GRACE_S = 60.0  # a run past its deadline gets this long to stop on Ctrl-C before it is killed


@dataclass(frozen=True)
class BenchShape:
    """How big the benchmark's runs are; the defaults per model keep it within minutes on 2 cores."""

    warmup_steps: int  # learner steps left out at the start
    measured_steps: int  # learner steps measured (intervals between published versions)
    max_new_tokens: int  # response budget per action
    episode_steps: int  # envs.max_steps
    envs_per_worker: int  # episodes one worker plays at once
    tasks_per_step: int  # groups of 4 per learner step


# The tiny model: 2 groups of 4 four-step episodes per step, all 8 at once; a few minutes.
# SmolLM2-135M: one group of 4 two-step episodes with 16-token actions (~2.2k training tokens a step):
# a bigger batch ran past 25 minutes on the 2-core machine; this finishes within 10 (BENCHMARKS.md).
SHAPES = {
    TINY: BenchShape(
        warmup_steps=3, measured_steps=6, max_new_tokens=32, episode_steps=4, envs_per_worker=8, tasks_per_step=2
    ),
    DEFAULT_MODEL: BenchShape(
        warmup_steps=1, measured_steps=2, max_new_tokens=16, episode_steps=2, envs_per_worker=4, tasks_per_step=1
    ),
}


@dataclass
class StepBreakdown:
    """Where one mode's learner step goes: seconds per learner step, means over the measured steps."""

    s_per_step: float  # between consecutive published versions
    train_s: float  # the learner's optimizer step (step_seconds)
    learner_wait_s: float  # the learner waiting for complete groups (wait_seconds)
    learner_other_s: float  # s_per_step - train_s - learner_wait_s: advantages, publishing the weights
    actor_busy_s: float  # actors' wall time with a group in play (generation, env steps, prompts), summed over workers
    actor_idle_s: float  # s_per_step - actor_busy_s, at least 0 (with several workers busy can exceed the step)
    actor_throttled_s: float  # actors' time held back by the gate (synchronous: waiting for the next version); it
    # can overlap busy time: a worker with room for another group waits at the gate while its last group finishes


def overlap_bound(generation_s: float, train_s: float) -> float:
    """(g + t) / max(g, t): the most that overlapping generation with training can speed a step up."""
    if generation_s < 0 or train_s < 0 or generation_s + train_s == 0:
        raise ValueError(f"generation ({generation_s}) and training ({train_s}) seconds must be >= 0, not both 0")
    return (generation_s + train_s) / max(generation_s, train_s)


def attribute_speedup(sync: StepBreakdown, overlapped: StepBreakdown) -> dict:
    """The speedup as the product of three factors (exact: they multiply back to it):
    overlap_bound (from the synchronous g and t), sync_overhead (synchronous step / (g + t)) and
    beyond_overlap (max(g, t) / overlapped step)."""
    g, t = sync.actor_busy_s, sync.train_s
    factors = {
        "speedup": sync.s_per_step / overlapped.s_per_step,
        "overlap_bound": overlap_bound(g, t),
        "sync_overhead": sync.s_per_step / (g + t),
        "beyond_overlap": max(g, t) / overlapped.s_per_step,
    }
    return {name: round(value, 3) for name, value in factors.items()}


def explain(factors: dict) -> str:
    """The one-line "where the speedup comes from"."""
    rest = factors["beyond_overlap"]
    why = (
        "the overlapped actors play a batch faster than the synchronous ones (no waiting for a batch's slowest episode)"
        if rest >= 1
        else "imperfect overlap: actors and learner slow each other down on shared cores"
    )
    return (
        f"speedup {factors['speedup']:.2f} = overlap bound {factors['overlap_bound']:.2f} "
        f"x synchronous hand-off overhead {factors['sync_overhead']:.2f} x {rest:.2f} beyond overlap ({why})"
    )


def step_breakdown(trace: list[dict], lines: list[dict], warmup_steps: int) -> StepBreakdown:
    """The breakdown of one run from its learner trace lines and metrics.jsonl lines (see module docstring);
    lines without learner figures (held-out evaluations) are ignored."""
    stamps = [entry["at"] for entry in trace][warmup_steps:]
    measured = len(stamps) - 1
    if measured < 2:
        raise RuntimeError(
            f"{len(trace)} learner steps leave {max(measured, 0)} measured after {warmup_steps} warm-up "
            "steps; the breakdown needs at least 2"
        )
    s_per_step = (stamps[-1] - stamps[0]) / measured
    by_step = {entry["step"]: entry for entry in lines if "learner/step_seconds" in entry}
    steps = [warmup_steps + 2 + index for index in range(measured)]  # the steps that end the measured intervals
    missing = [step for step in steps if step not in by_step]
    if missing:
        raise RuntimeError(f"metrics.jsonl has no learner line for steps {missing}")
    train = sum(by_step[step]["learner/step_seconds"] for step in steps) / measured
    wait = sum(by_step[step]["learner/wait_seconds"] for step in steps) / measured
    first, last = by_step[warmup_steps + 1], by_step[steps[-1] - 1]
    span = last["time"] - first["time"]
    if span <= 0 or "actors/busy_s" not in first or "actors/busy_s" not in last:
        raise RuntimeError(
            f"metrics.jsonl lines of steps {first['step']} and {last['step']} give no window to "
            "measure the actors over (no actor summaries, or written at the same moment)"
        )
    busy = (last["actors/busy_s"] - first["actors/busy_s"]) / span * s_per_step
    throttled = (last["actors/throttled_s"] - first["actors/throttled_s"]) / span * s_per_step
    values = dict(
        s_per_step=s_per_step,
        train_s=train,
        learner_wait_s=wait,
        learner_other_s=s_per_step - train - wait,
        actor_busy_s=busy,
        actor_idle_s=max(s_per_step - busy, 0.0),
        actor_throttled_s=throttled,
    )
    return StepBreakdown(**{name: round(value, 3) for name, value in values.items()})


def _settings(model: str, run_dir: str, shape: BenchShape) -> list[str]:
    """The benchmark's run: configs/local.yaml with no library (its load is the same in both modes
    and not what is compared), short episodes of its games, no checkpoint before the end, no held-out
    evaluation, one worker playing `envs_per_worker` episodes at once, groups of 4."""
    return [
        f"run.dir={run_dir}",
        "run.preset=grpo",
        f"model.name={model}",
        f"model.max_new_tokens={shape.max_new_tokens}",
        f"envs.max_steps={shape.episode_steps}",
        "envs.panel_size=4",
        "actors.num_workers=1",
        f"actors.envs_per_worker={shape.envs_per_worker}",
        "actors.group_size=4",
        f"learner.tasks_per_step={shape.tasks_per_step}",
        "learner.checkpoint_every=1000",
        "monitoring.sinks=[jsonl]",
        "monitoring.plots=false",
        "eval.every=0",
    ]


def _train(mode: str, settings: list[str], steps: int, run_dir: Path, deadline: float) -> float:
    """`slea train` for one mode in a subprocess (its output goes to stderr); returns its wall seconds.
    Past `deadline` (monotonic) it is stopped like Ctrl-C, then killed, and this raises TimeoutError."""
    overrides = [
        *settings,
        f"run.id=bench-{mode}",
        f"learner.max_steps={steps}",
        f"actors.synchronous={mode == 'sync'}",
    ]
    command = [sys.executable, "-m", "driver.cli", "train", "configs/local.yaml"]
    for override in overrides:
        command += ["--set", override]
    started = time.monotonic()
    # Its own session: the deadline stops the run and everything it started (Ray, Redis) as one group.
    process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr, start_new_session=True)
    try:
        code = process.wait(timeout=max(deadline - started, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)  # slea train's graceful stop
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        trace = run_dir / f"bench-{mode}" / "learner" / "trained_groups.jsonl"
        done = len(trace.read_text().splitlines()) if trace.is_file() else 0
        raise TimeoutError(
            f"the {mode} run did not finish {steps} learner steps before the benchmark's deadline "
            f"({done} done after {time.monotonic() - started:.0f} s): measure fewer --steps, or "
            "give it longer with --timeout"
        ) from None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the run's process group is left
        except ProcessLookupError:
            pass
    if code != 0:
        raise RuntimeError(f"the {mode} run (slea train) stopped with exit code {code}; its output is above")
    return time.monotonic() - started


def _breakdown(run_dir: Path, warmup_steps: int) -> StepBreakdown:
    """The raw lines, not read_metrics' merge per step: a merged step's "time" could be another line's."""
    read = [(run_dir / "learner" / "trained_groups.jsonl").read_text(), (run_dir / METRICS_FILE).read_text()]
    trace, lines = ([json.loads(line) for line in text.splitlines()] for text in read)
    return step_breakdown(trace, lines, warmup_steps)


def bench_async(
    model: str = DEFAULT_MODEL,
    measured_steps: int | None = None,
    warmup_steps: int | None = None,
    timeout_s: float = 600.0,
) -> dict:
    """Both runs, their breakdowns and the attribution. `measured_steps`, `warmup_steps` None: the
    model's (SHAPES; a model not listed there gets SmolLM2's shape); `timeout_s`: both runs together,
    start-up included."""
    shape = SHAPES.get(model, SHAPES[DEFAULT_MODEL])
    if measured_steps is not None:
        if measured_steps < 2:
            raise ValueError(
                f"--steps must be at least 2 (the actors' window spans steps - 1 intervals), not {measured_steps}"
            )
        shape = BenchShape(**{**asdict(shape), "measured_steps": measured_steps})
    if warmup_steps is not None:
        if warmup_steps < 1:
            raise ValueError(
                f"--warmup must be at least 1 (the first step includes loading the model), not {warmup_steps}"
            )
        shape = BenchShape(**{**asdict(shape), "warmup_steps": warmup_steps})
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="slea-bench-async-") as tmp:
        model_name = model
        if model == TINY:
            from slea.models import tiny_model

            policy, tokenizer = tiny_model(seed=1)
            model_name = str(Path(tmp) / "tiny-policy")
            policy.save_pretrained(model_name)
            tokenizer.save_pretrained(model_name)
        settings = _settings(model_name, tmp, shape)
        steps = shape.warmup_steps + shape.measured_steps + 1  # +1: the measured window spans measured_steps intervals
        wall = {mode: _train(mode, settings, steps, Path(tmp), deadline) for mode in ("sync", "async")}
        modes = {mode: _breakdown(Path(tmp) / f"bench-{mode}", shape.warmup_steps) for mode in ("sync", "async")}
    factors = attribute_speedup(modes["sync"], modes["async"])
    return {
        "sync_s_per_step": round(modes["sync"].s_per_step, 2),
        "async_s_per_step": round(modes["async"].s_per_step, 2),
        "speedup": round(factors["speedup"], 2),
        "overlap_bound": round(factors["overlap_bound"], 2),
        "sync_overhead": round(factors["sync_overhead"], 2),
        "beyond_overlap": round(factors["beyond_overlap"], 2),
        "attribution": explain(factors),
        "sync": asdict(modes["sync"]),
        "async": asdict(modes["async"]),
        "learner_steps": steps,
        "measured_steps": shape.measured_steps,
        "warmup_steps": shape.warmup_steps,
        "sync_wall_s": round(wall["sync"], 1),
        "async_wall_s": round(wall["async"], 1),
        "model": model,
        "max_new_tokens": shape.max_new_tokens,
        "config": "configs/local.yaml, "
        + ", ".join(s for s in settings if not s.startswith(("run.dir", "model.name"))),
    }


def format_report(result: dict) -> str:
    """The human output: the headline figures, then the breakdown table per mode."""
    rows = [
        f"speedup {result['speedup']} (sync {result['sync_s_per_step']} s/step, async {result['async_s_per_step']} s/step, "
        f"{result['measured_steps']} measured steps after {result['warmup_steps']}, model {result['model']})",
        result["attribution"],
        "",
        f"{'seconds per learner step':<26}{'sync':>10}{'async':>10}",
    ]
    for field in StepBreakdown.__dataclass_fields__:
        rows.append(f"{field:<26}{result['sync'][field]:>10.2f}{result['async'][field]:>10.2f}")
    rows += [
        "",
        f"wall: sync {result['sync_wall_s']} s, async {result['async_wall_s']} s",
        f"config: {result['config']}",
    ]
    return "\n".join(rows)
