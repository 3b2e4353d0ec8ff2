"""What `slea train` shows: each start-up phase as it happens, the live table, the closing summary.

A first run must say what it is doing from its first second: starting Redis and Ray, loading
the models, evaluating the base policy. On a terminal a phase shows a spinner and then one line
with its duration; in a log (CI, `kubectl logs`, a pipe) the same phases are plain timestamped
lines, as are learner steps and evaluation progress, so nothing depends on a terminal.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slea.config import SleaConfig

EVAL_PROGRESS_EVERY_S = 15.0  # plain-line logs print evaluation progress at most this often


class RunConsole:
    """Timestamped start-up phases and notes, on a terminal or as plain lines."""

    def __init__(self, console: Console):
        self.console = console
        self.started = time.monotonic()
        self.log = None  # driver/run_log.py AttemptLog: every line also goes into the run directory

    def line(self, text: str) -> None:
        """`text` as one line, on the console and in the attempt's log."""
        self.console.print(text, highlight=False, soft_wrap=True)
        if self.log is not None:
            self.log.write(text)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, text: str) -> None:
        # soft_wrap: a log line stays one line (off a terminal rich would wrap it at 80 columns)
        self.line(f"[dim]{self.elapsed():6.1f}s[/] {text}")

    @contextlib.contextmanager
    def phase(self, doing: str) -> Iterator[None]:
        """`doing` while the block runs (a spinner on a terminal, a line in a log), then its duration."""
        started = time.monotonic()
        if self.console.is_terminal:
            if self.log is not None:  # the spinner's line, which the log has no other way to show
                self.log.write(f"{self.elapsed():6.1f}s {doing} ...")
            with self.console.status(f"{doing} ..."):
                yield
        else:
            self.note(f"{doing} ...")
            yield
        self.note(f"{doing}: done in {time.monotonic() - started:.1f} s")


class Progress:
    """What the display shows, accumulated from learner metrics, pool summaries and evaluations."""

    def __init__(self, config: SleaConfig):
        self.config = config
        self.started = time.monotonic()
        self.last_step_at = self.started
        self.seconds_per_step = 0.0
        self.latest: dict = {}
        self.successes: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # task type -> [wins, episodes]
        # (learner step, held-out success) of the newest evaluation
        self.latest_eval: tuple[int, float | None] | None = None
        # (learner step, episodes played, episodes in the evaluation) of the one running, if any
        self.eval_running: tuple[int, int, int] | None = None
        self._eval_logged: tuple[int, int, int] | None = None  # the progress of the last log line
        self._eval_logged_at = 0.0

    def add_step(self, metrics: dict) -> None:
        now = time.monotonic()
        self.seconds_per_step, self.last_step_at = now - self.last_step_at, now
        self.latest = metrics
        for key, value in metrics.items():
            if key.startswith("episodes/"):
                _, task_type, what = key.split("/")
                self.successes[task_type][0 if what == "successes" else 1] += int(value)

    def log_line(self, line: dict) -> str:
        success = line.get("actors/success_rate")
        return (
            f"step {self.latest.get('learner_step', 0)}/{self.config.learner.max_steps} "
            f"version {self.latest.get('policy_version', 0)} "
            f"success {'-' if success is None else f'{success:.2f}'} "
            f"loss {self.latest.get('loss', 0.0):.4f} lag {line.get('stream/lag/learner', 0)} "
            f"{self.seconds_per_step:.1f} s/step"
        )

    def eval_progress(self, progress: tuple[int, int, int] | None) -> str | None:
        """Record the running evaluation's progress; returns a log line when it has moved since the
        last one and that was at least EVAL_PROGRESS_EVERY_S ago (logs only: the table shows every count)."""
        self.eval_running = progress
        if progress is None or progress == self._eval_logged:
            return None
        if time.monotonic() - self._eval_logged_at < EVAL_PROGRESS_EVERY_S:
            return None
        self._eval_logged, self._eval_logged_at = progress, time.monotonic()
        return eval_progress_text(*progress)

    def table(self, pool: list[dict], lag: int, library: dict | None) -> Table:
        cfg = self.config
        table = Table(title=f"slea train: {cfg.run.id} ({cfg.run.preset})", show_header=False)
        table.add_row("learner step", f"{self.latest.get('learner_step', 0)} / {cfg.learner.max_steps}")
        table.add_row("policy version", str(self.latest.get("policy_version", 0)))
        table.add_row("episodes (actors)", str(sum(s["episodes_finished"] for s in pool)))
        for task_type, (wins, episodes) in sorted(self.successes.items()):
            table.add_row(f"success {task_type}", f"{wins}/{episodes} ({wins / max(episodes, 1):.0%})")
        steps, strategy_steps, warning_steps = shown_counts(pool)
        if steps:
            table.add_row(
                "prompts with experiences", f"strategies {strategy_steps}, warnings {warning_steps} of {steps}"
            )
        if self.latest_eval is not None:
            step, success = self.latest_eval
            table.add_row("held-out success", f"{'-' if success is None else f'{success:.0%}'} (step {step})")
        if self.eval_running is not None:
            table.add_row("evaluating", eval_progress_text(*self.eval_running))
        table.add_row("stream lag (learner)", str(lag))
        if library is not None:
            table.add_row("library", library_text(library))
        table.add_row("s / learner step", f"{self.seconds_per_step:.1f}")
        table.add_row("elapsed", f"{time.monotonic() - self.started:.0f} s")
        return table


def eval_progress_text(learner_step: int, played: int, episodes: int) -> str:
    what = "the base policy" if learner_step == 0 else f"the policy of step {learner_step}"
    return f"held-out evaluation of {what}: {played} of {episodes} episodes played"


def shown_counts(pool: list[dict]) -> tuple[int, int, int]:
    """(steps played, steps whose prompt showed a strategy, ... a warning), summed over workers."""
    timers = [summary["timers"] for summary in pool]
    return tuple(sum(t[key] for t in timers) for key in ("steps", "strategy_steps", "warning_steps"))


def library_text(library: dict) -> str:
    zones: dict[str, int] = defaultdict(int)
    for zone_level, size in library["experiences"].items():
        zones[zone_level.split("/")[0]] += size
    return (
        f"v{library['version']}: {zones['strategy']} strategies, {zones['warning']} warnings, "
        f"{library['clusters']} clusters"
    )


def summary_lines(
    evaluations: list[dict],
    progress: Progress,
    pool: list[dict],
    library: dict | None,
    run_dir: Path,
    checkpoint: Path | None,
    wall_s: float,
) -> list[str]:
    """The closing summary: what the run did, what changed between its first and last held-out
    evaluation, what the library holds, where the outputs are, and what to try next.
    `evaluations` are metrics.jsonl entries with an `eval/success_rate`, in step order."""
    cfg = progress.config
    wins = sum(won for won, _ in progress.successes.values())
    episodes = sum(played for _, played in progress.successes.values())
    lines = [
        f"run {cfg.run.id} ({cfg.run.preset}, {cfg.envs.name}): {progress.latest.get('learner_step', 0)} learner "
        f"steps, policy v{progress.latest.get('policy_version', 0)}, {wall_s / 60:.1f} min",
        f"training episodes: {wins} of {episodes} won",
    ]
    if len(evaluations) >= 2:
        first, last = evaluations[0], evaluations[-1]
        lines.append(
            f"held-out panel, step {first['step']} -> {last['step']}: "
            + "; ".join(_changed(first, last, key, name) for key, name in _EVAL_KEYS if key in first and key in last)
        )
    elif evaluations:
        lines.append(f"held-out success at step {evaluations[0]['step']}: {evaluations[0]['eval/success_rate']:.0%}")
    steps, strategy_steps, warning_steps = shown_counts(pool)
    if library is not None:
        lines.append(
            f"library {library_text(library)}; of {steps} training prompts {strategy_steps} showed strategies "
            f"and {warning_steps} warnings"
        )
    lines.append(f"plots: {run_dir / 'plots'}   metrics: {run_dir / 'metrics.jsonl'}")
    if checkpoint is not None:
        lines.append(f"checkpoint: {checkpoint / 'hf'} (loads with transformers and vLLM)")
    lines.append(
        f"next: slea library show {run_dir}  |  slea eval {run_dir}  |  "
        f"slea train --resume {run_dir} --set learner.max_steps={cfg.learner.max_steps * 2}"
    )
    return lines


def time_line(entries: list[dict], pool: list[dict], startup_s: float, wall_s: float) -> str:
    """Where the run's wall time went, process by process: the start-up phases, the learner
    (training, and idle waiting for groups), the held-out evaluations, and the actors (busy: the
    engine, the environments, the library; held back by redis.max_lag while the learner is behind).
    The engine's seconds are summed over the episodes an actor plays at once, so they can exceed
    its busy time; they split into prefill (reading prompts), decode (writing responses) and
    queued (waiting for the batch in flight), and with vLLM the share of prompt tokens its prefix
    cache held. `entries`: metrics.jsonl; `pool`: the actor workers' summaries."""
    updates = [entry for entry in entries if "learner/step_seconds" in entry]
    trained = sum(entry["learner/step_seconds"] for entry in updates)
    waited = sum(entry.get("learner/wait_seconds", 0.0) for entry in updates)
    evaluations = [entry["eval/seconds"] for entry in entries if "eval/seconds" in entry]
    timers = {key: sum(summary["timers"][key] for summary in pool) for key in _SUMMED_TIMERS}
    busy, throttled = (sum(summary.get(key, 0.0) for summary in pool) for key in ("busy_s", "throttled_s"))
    actor = ", ".join(f"{name} {timers[key]:.0f}" for key, name in _ACTOR_TIMERS.items())
    queued = timers["generation_s"] - timers["prefill_s"] - timers["decode_s"]
    engine = f"engine: prefill {timers['prefill_s']:.0f}, decode {timers['decode_s']:.0f}, queued {queued:.0f}"
    if any(summary.get("engine") == "vllm" for summary in pool):  # the transformers engine has no prefix cache
        cached = timers["cached_prompt_tokens"] / max(timers["prompt_tokens"], 1)
        engine += f"; prefix cache {cached:.0%} of {timers['prompt_tokens']} prompt tokens"
    return (
        f"time, of {wall_s:.0f} s: start-up {startup_s:.0f} s | learner {trained:.0f} s training "
        f"({len(updates)} updates), {waited:.0f} s waiting for groups | held-out evaluation "
        f"{sum(evaluations):.0f} s ({' + '.join(f'{seconds:.0f}' for seconds in evaluations) or 'none'}) | "
        f"actors busy {busy:.0f} s ({actor}; {engine}), held back {throttled:.0f} s"
    )


# StepTimers fields (actors/episode.py) and how the time line names them
_ACTOR_TIMERS = {"generation_s": "engine", "env_s": "environments", "retrieval_wait_s": "library", "overhead_s": "ours"}
_SUMMED_TIMERS = (*_ACTOR_TIMERS, "prefill_s", "decode_s", "prompt_tokens", "cached_prompt_tokens")

# (metrics.jsonl key, how the summary names it)
_EVAL_KEYS = (
    ("eval/success_rate", "success as deployed (with the library when the run has one)"),
    ("eval/sampled/no_library/success_rate", "the policy alone"),
    ("eval/sampled/no_library/invalid_action_rate", "invalid actions"),
)


def _changed(first: dict, last: dict, key: str, name: str) -> str:
    return f"{name} {first[key]:.0%} -> {last[key]:.0%}"
