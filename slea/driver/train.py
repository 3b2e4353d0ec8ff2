"""`slea train`: the whole asynchronous system from one config.

Services first (run directory, Redis, Ray), then the library writer and its Serve app, the
learner (`learner.num_ranks` Ray actors; the driver talks to rank 0), and the actor pool, each
placed by its own resources. The driver only watches: it supervises the pool, drains learner
metrics into the run directory, and draws the progress display. Actors never wait for the
learner and the learner never waits for a rollout phase; they meet in the stream and the weight
registry.

Stopping: the learner finishing `learner.max_steps`, or Ctrl-C / SIGTERM, stops the actors from
starting groups (their half episodes are marked abandoned), lets the learner checkpoint and the
library snapshot, then stops Serve, Ray and the embedded Redis. A second Ctrl-C exits at once.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

import ray
from rich.console import Console
from rich.live import Live
from rich.table import Table

from slea.channels import RAY_NAMESPACE
from slea.config import SleaConfig, check_trainable
from slea.redis_conn import connect
from slea.services import STREAM_GROUPS, prepare_run_dir, redis_for_run, sigterm_as_interrupt
from slea.stream_admin import group_stats, trim_acknowledged
from slea.streams import ensure_group

POLL_S = 2.0


def run_metrics(learner: dict, lags: dict[str, int], library: dict | None, pool: list[dict] | None = None) -> dict:
    """One flat metrics.jsonl line (keys documented in slea/driver/run_outputs.py) from a learner step,
    the stream's lag per group, the library's sizes and the actor workers' summaries. From the
    summaries: "actors/busy_s" and "actors/throttled_s", seconds with a group in play and seconds
    held back by the gate, summed over workers since each (incarnation) started, as of the line's
    "time": `slea bench async` divides their growth by the time between two lines; and
    "actors/tokens/<engine>", the tokens generated so far by the workers of each engine."""
    line: dict[str, float] = {}
    wins = episodes = 0
    for key, value in learner.items():
        if key.startswith("episodes/"):
            continue
        if isinstance(value, dict):  # histograms: one series per bucket
            line.update({f"learner/{key}/{bucket}": count for bucket, count in value.items()})
        else:
            line[f"learner/{key}"] = value
    for key, value in learner.items():
        if key.startswith("episodes/") and key.endswith("/episodes"):
            task_type = key.split("/")[1]
            won = learner[f"episodes/{task_type}/successes"]
            line[f"actors/success_rate/{task_type}"] = won / value
            wins, episodes = wins + won, episodes + value
    if episodes:
        line["actors/success_rate"] = wins / episodes
        line["actors/episode_length"] = learner["episode_length_mean"]
    line.update({f"stream/lag/{group}": lag for group, lag in lags.items()})
    if pool:
        line["actors/busy_s"] = sum(summary["busy_s"] for summary in pool)
        line["actors/throttled_s"] = sum(summary["throttled_s"] for summary in pool)
        for summary in pool:
            tokens = f"actors/tokens/{summary['engine']}"
            line[tokens] = line.get(tokens, 0) + summary["timers"]["tokens"]
    if library is not None:
        for zone_level, size in library["experiences"].items():
            zone = zone_level.split("/")[0]
            line[f"library/size/{zone}"] = line.get(f"library/size/{zone}", 0) + size
        line["library/version"] = library["version"]
    return line


class Progress:
    """What the display shows, accumulated from learner metrics and pool summaries."""

    def __init__(self, config: SleaConfig):
        self.config = config
        self.started = time.monotonic()
        self.last_step_at = self.started
        self.seconds_per_step = 0.0
        self.latest: dict = {}
        self.successes: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # task type -> [wins, episodes]
        self.latest_eval: tuple[int, float | None] | None = (
            None  # (learner step, held-out success) of the newest evaluation
        )

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

    def table(self, pool: list[dict], lag: int, library: dict | None) -> Table:
        cfg = self.config
        table = Table(title=f"slea train: {cfg.run.id} ({cfg.run.preset})", show_header=False)
        table.add_row("learner step", f"{self.latest.get('learner_step', 0)} / {cfg.learner.max_steps}")
        table.add_row("policy version", str(self.latest.get("policy_version", 0)))
        table.add_row("episodes (actors)", str(sum(s["episodes_finished"] for s in pool)))
        for task_type, (wins, episodes) in sorted(self.successes.items()):
            table.add_row(f"success {task_type}", f"{wins}/{episodes} ({wins / max(episodes, 1):.0%})")
        if self.latest_eval is not None:
            step, success = self.latest_eval
            table.add_row("held-out success", f"{'-' if success is None else f'{success:.0%}'} (step {step})")
        table.add_row("stream lag (learner)", str(lag))
        if library is not None:
            table.add_row(
                "library",
                f"v{library['version']}, {sum(library['experiences'].values())} experiences, "
                f"{library['clusters']} clusters",
            )
        table.add_row("s / learner step", f"{self.seconds_per_step:.1f}")
        table.add_row("elapsed", f"{time.monotonic() - self.started:.0f} s")
        return table


def train(config: SleaConfig, resume_dir: str | None = None) -> int:
    console = Console(stderr=True)
    check_trainable(config)
    run_dir = prepare_run_dir(config, resume_dir)
    console.print(f"[bold]slea train[/] run [cyan]{config.run.id}[/] preset [cyan]{config.run.preset}[/] in {run_dir}")
    interrupts = {"count": 0}

    def on_sigint(_signum, _frame):
        interrupts["count"] += 1
        if interrupts["count"] > 1:
            console.print("[red]second Ctrl-C: exiting now[/]")
            os._exit(130)
        raise KeyboardInterrupt

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    try:
        with sigterm_as_interrupt(), redis_for_run(config, run_dir) as url:
            config.redis.url = url
            return _run(config, run_dir, console, resumed=resume_dir is not None)
    finally:
        signal.signal(signal.SIGINT, previous_handler)


def _run(config: SleaConfig, run_dir, console: Console, resumed: bool = False) -> int:
    from actors.pool import ActorPool
    from learner.process import start_learner
    from monitoring.ray_metrics import use_ray_metrics

    client = connect(config.redis)
    stream = config.stream_key()
    for group in STREAM_GROUPS:
        ensure_group(client, stream, group)
    ray.init(
        address=config.ray.address,
        num_cpus=config.ray.num_cpus if config.ray.address is None else None,
        namespace=RAY_NAMESPACE,
        include_dashboard=False,
        log_to_driver=False,
        ignore_reinit_error=True,
    )
    if config.monitoring.metrics_port is None:
        use_ray_metrics()  # the driver's gauges (stream lag) go out through Ray's metrics port too
    else:
        from monitoring.metrics import serve_metrics

        serve_metrics(config.monitoring.metrics_port, config.monitoring.metrics_host)
    recorder = _recorder(config, run_dir)
    progress = Progress(config)
    library = learner = pool = None
    library_run, learner_runs = None, []
    try:
        if config.library.enabled:
            library, library_run = _start_library(config, run_dir)
        ranks = start_learner(
            config,
            num_cpus=config.learner.num_cpus,
            num_gpus=config.learner.num_gpus,
            resources=dict(config.learner.resources) or None,
        )
        learner = ranks[0]  # the driver talks to rank 0; the other ranks follow it
        learner_runs = [rank.run.remote() for rank in ranks]
        evals = _start_evaluator(config, run_dir)
        if evals is not None and not resumed and config.eval.before_training:
            evals.on_learner_step(0, final=True)  # the policy before any update: the curve's first point
        pool = ActorPool(config, config.redis.url)
        pool.scale(config.actors.num_workers)
        with Live(console=console, refresh_per_second=1, transient=False) as live:
            while True:
                done, _ = ray.wait(learner_runs, timeout=POLL_S)  # any rank returning ends the learner
                pool.supervise()
                lags = {name: group.lag for name, group in group_stats(client, stream).items()}
                trim_acknowledged(client, stream, list(STREAM_GROUPS) if config.library.enabled else ["learner"])
                stats = ray.get(library.stats.remote()) if library is not None else None
                summaries = pool.summaries()
                for metrics in ray.get(learner.drain_metrics.remote()):
                    progress.add_step(metrics)
                    line = run_metrics(metrics, lags, stats, summaries)
                    recorder.record(metrics["learner_step"], line)
                    if not console.is_terminal:  # logs (CI, kubectl logs) get one line per step instead
                        console.print(progress.log_line(line))
                    if evals is not None:
                        evals.on_learner_step(metrics["learner_step"])
                if evals is not None:
                    _record_evals(evals.poll(), progress, recorder, console)
                live.update(progress.table(summaries, lags.get("learner", 0), stats))
                if done:
                    ray.get(learner_runs)  # surfaces a learner failure (on any rank)
                    break
        if evals is not None:  # the last policy's point: actors stop first, so it gets the CPUs
            pool.stop()
            pool = None
            evals.on_learner_step(progress.latest.get("learner_step", 0), final=True)
            console.print("final held-out evaluation ...")
            while evals.busy:
                _record_evals(evals.poll(timeout_s=POLL_S), progress, recorder, console)
        console.print(
            f"[green]done[/]: {progress.latest.get('learner_step', 0)} learner steps, "
            f"policy version {progress.latest.get('policy_version', 0)}; outputs in {run_dir}"
        )
        return 0
    except KeyboardInterrupt:
        console.print(
            "[yellow]stopping: actors abandon the groups in flight, the learner checkpoints, the library snapshots "
            "(Ctrl-C again to exit at once)[/]"
        )
        return 130
    finally:
        _shutdown(pool, learner, learner_runs, library, library_run, recorder)
        ray.shutdown()
        client.close()


def _start_library(config: SleaConfig, run_dir):
    from library.process import LibraryProcess
    from library.service import start_serve_app

    library = LibraryProcess.options(num_cpus=1, resources=dict(config.library.resources) or None).remote(
        config.model_dump(mode="json"), config.redis.url, str(run_dir)
    )
    ray.get(library.stats.remote())  # the writer has published its first snapshot: replicas can start
    run = library.run.remote()
    start_serve_app(config, config.redis.url)
    return library, run


def _start_evaluator(config: SleaConfig, run_dir):
    """The held-out evaluator and its schedule, or None when `eval.every` is 0."""
    if config.eval.every == 0:
        return None
    from slea.driver.train_eval import EvalSchedule, PanelEvaluator

    evaluator = PanelEvaluator.options(num_cpus=config.eval.num_cpus, num_gpus=config.eval.num_gpus).remote(
        config.model_dump(mode="json"), str(run_dir)
    )
    return EvalSchedule(evaluator, config.eval.every)


def _record_evals(finished: list[tuple[int, dict]], progress: Progress, recorder, console: Console) -> None:
    from slea.driver.train_eval import HEADLINE

    for learner_step, metrics in finished:
        recorder.record(learner_step, metrics)
        progress.latest_eval = (learner_step, metrics.get(HEADLINE))
        console.print(
            f"held-out eval at step {learner_step} (policy v{metrics['eval/policy_version']}): "
            f"success {metrics.get(HEADLINE, float('nan')):.2f}"
        )


def _recorder(config: SleaConfig, run_dir):
    from slea.driver.run_outputs import RunRecorder

    return RunRecorder(run_dir, tensorboard=config.monitoring.tensorboard, plots=config.monitoring.plots)


def _shutdown(pool, learner, learner_runs, library, library_run, recorder) -> None:
    """Graceful order: no new groups -> learner checkpoint -> library snapshot -> Serve down."""
    if pool is not None:
        pool.stop()
    if learner is not None:
        learner.stop.remote()
        ray.wait(learner_runs, num_returns=len(learner_runs), timeout=600)
        for metrics in ray.get(learner.drain_metrics.remote()):
            recorder.record(metrics["learner_step"], run_metrics(metrics, {}, None))
    if library is not None:
        library.stop.remote()
        ray.wait([library_run], timeout=300)
        from ray import serve

        serve.shutdown()
    recorder.close()
