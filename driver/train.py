"""`slea train`: the whole asynchronous system from one config.

Services first (run directory, Redis, Ray), then the learner (`learner.num_ranks` Ray actors;
the driver talks to rank 0), which loads while the library writer and its Serve app and then the
actor pool start, each placed by its own resources. The driver only watches: it supervises the
pool, restarts a dead learner or library writer (driver/supervision.py, up to run.max_failures),
drains learner metrics into the run directory, and draws the progress display. Actors never wait
for the learner and the learner never waits for a rollout phase; they meet in the stream and the
weight registry.

Stopping: the learner finishing `learner.max_steps` (or its step when `run.max_seconds` has
passed), or Ctrl-C / SIGTERM, stops the actors from
starting groups (their half episodes are marked abandoned), lets the learner checkpoint and the
library snapshot, then stops Serve, Ray and the embedded Redis. A second Ctrl-C exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, wait

import ray
import redis
from rich.console import Console
from rich.live import Live

from driver.progress import Progress, RunConsole, summary_lines, time_line
from driver.retention import retained
from driver.serve_health import ServeHealth
from monitoring.metrics import metric
from slea.channels import LIBRARY_APP, RAY_NAMESPACE
from slea.config import ConfigError, SleaConfig, check_trainable
from slea.gpu_visibility import gpu_options
from slea.redis_conn import connect, with_reconnect
from slea.services import interrupt_on_sigterm, prepare_run_dir, redis_for_run, sigterm_as_interrupt, stream_groups
from slea.stream_admin import GroupStats, group_stats, trim_acknowledged
from slea.streams import ensure_group

POLL_S = 2.0
# A graceful stop's waits (_shutdown), one after the other after the actors' (actors/pool.py
# RETIRE_TIMEOUT_S): the pods that run the stop outlive their sum (deploy/k8s/base/rayjob.yaml
# terminationGracePeriodSeconds), or Kubernetes kills them before the checkpoint is on the claim.
LEARNER_CHECKPOINT_WAIT_S = 600.0  # for the learner's final checkpoint (a large model's ZeRO state)
LIBRARY_SNAPSHOT_WAIT_S = 300.0  # for the library writer's final snapshot


def run_metrics(learner: dict, lags: dict[str, int], library: dict | None, pool: list[dict] | None = None) -> dict:
    """One flat metrics.jsonl line (keys documented in driver/run_outputs.py) from a learner step,
    the stream's lag per group, the library's sizes and the actor workers' summaries. From the
    summaries: "actors/busy_s" and "actors/throttled_s", seconds with a group in play and seconds
    held back by the gate, summed over workers since each (incarnation) started, as of the line's
    "time": `slea bench async` divides their growth by the time between two lines; and
    "actors/tokens/<engine>", the tokens generated so far by the workers of each engine. From the
    library: "library/prompts/seen", the training prompts its writer applied since it started, and
    "library/prompts/<zone>", those that showed at least one strategy or warning (`slea compare`
    turns their growth between evaluations into shares)."""
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
        line.update({f"library/prompts/{what}": count for what, count in library["prompts"].items()})
    return line


def train(config: SleaConfig, resume_dir: str | None = None) -> int:
    console = RunConsole(Console(stderr=True))
    check_trainable(config)
    run_dir = prepare_run_dir(config, resume_dir)
    from driver.run_log import AttemptLog

    console.log = AttemptLog(run_dir)  # this attempt's lines, warnings and failure, on the run's volume
    try:
        return _train(config, run_dir, console, resumed=resume_dir is not None)
    except BaseException as exc:
        console.log.failure(exc)
        raise
    finally:
        console.log.close()


def _train(config: SleaConfig, run_dir, console: RunConsole, resumed: bool) -> int:
    console.note(
        f"[bold]slea train[/] run [cyan]{config.run.id}[/] preset [cyan]{config.run.preset}[/] "
        f"env [cyan]{config.envs.name}[/] model [cyan]{config.model.name}[/], {config.learner.max_steps} learner "
        f"steps; outputs in {run_dir}"
    )
    interrupts = {"count": 0}

    def on_sigint(_signum, _frame):
        interrupts["count"] += 1
        if interrupts["count"] > 1:
            console.console.print("[red]second Ctrl-C: exiting now[/]")
            os._exit(130)
        raise KeyboardInterrupt

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    shared_redis = config.redis.url is not None
    try:
        with sigterm_as_interrupt(), contextlib.ExitStack() as services:
            with console.phase(
                "starting Redis (embedded, AOF in the run directory)"
                if config.redis.url is None
                else "connecting to Redis"
            ):
                config.redis.url = services.enter_context(redis_for_run(config, run_dir))
            if shared_redis and config.redis.retention_s is not None:
                services.enter_context(retained(config, console))
            return _run(config, run_dir, console, resumed=resumed)
    finally:
        signal.signal(signal.SIGINT, previous_handler)


def _run(config: SleaConfig, run_dir, console: RunConsole, resumed: bool = False) -> int:
    from actors.pool import ActorPool
    from driver.pool_control import PoolSizer
    from driver.supervision import Supervisor, in_background

    client = connect(config.redis)
    unread = create_stream_groups(client, config)
    if unread:
        console.note(
            f"[yellow]warning[/]: the stream {config.stream_key()} has consumer group(s) {', '.join(unread)} that this "
            "run does not read; the driver trims only what every group acknowledged, so the stream grows until they "
            f"read it or are removed (XGROUP DESTROY {config.stream_key()} <group>)"
        )
    _join_ray(config, console)
    recorder = _recorder(config, run_dir)
    progress = Progress(config)
    library = learner = pool = sizer = None
    startup_s = 0.0  # until the actors start: start-up phases (the summary's time line)
    supervisor = Supervisor(
        config.run.max_failures,
        console.note,
        window_s=config.run.failure_window_s,
        hang_timeout_s=config.run.hang_timeout_s,
    )
    summaries, stats = [], None
    try:
        _check_gpus(config, console)
        sizer = PoolSizer(config, run_dir, console.note)  # first: a second driver of this run id stops here
        # The learner loads while the library and the actors start: the actors play their first group
        # with the initial weights meanwhile, which the learner would otherwise sit waiting for. A resumed
        # run's pool waits for it, though: the learner rolls the admission counts back to its checkpoint
        # on start (learner/admission_report.py), and the actors must not claim groups by the old ones.
        ranks_text = f"{config.learner.num_ranks} DeepSpeed ranks" if config.learner.num_ranks > 1 else "DeepSpeed"
        loading_learner = f"loading the learner ({config.model.name}, {ranks_text}, ZeRO-{config.learner.zero_stage})"
        console.note(f"{loading_learner}, beside the start of the library and the actors ...")
        started = time.monotonic()
        learner_loaded = in_background(lambda: (_start_learner(config, run_dir), time.monotonic()))
        if config.library.enabled:
            with console.phase("starting the experience library (writer, Ray Serve retrieval app, MiniLM embeddings)"):
                library = _start_library(config, run_dir)
        if resumed:
            learner = _learner_when_loaded(learner_loaded, started, loading_learner, console)
        evals = _start_evaluator(config, run_dir)
        if evals is not None and not resumed and config.eval.before_training:
            evals.on_learner_step(0, final=True)  # the policy before any update: the curve's first point
        pool = ActorPool(config, config.redis.url)
        sizer.start(pool)  # actors.num_workers; `slea scale` and actors.autoscale resize it from here
        startup_s = console.elapsed()
        actors = config.actors
        console.note(
            f"{actors.num_workers} actor worker(s) x {actors.envs_per_worker} envs ({actors.engine}) play {config.envs.name} "
            f"in groups of {actors.group_size}; each learner step trains on {config.learner.tasks_per_step} group(s)"
        )
        if not resumed:
            learner = _learner_when_loaded(learner_loaded, started, loading_learner, console)
        # Off a terminal (CI, kubectl logs, a pipe) the step, evaluation and pool lines are the display.
        live = (
            Live(console=console.console, refresh_per_second=1, transient=False)
            if console.console.is_terminal
            else None
        )
        watch = Watch(
            config,
            client,
            pool,
            sizer,
            drain_learner=lambda: learner.call("drain_metrics", default=[]),  # a dead learner's restart comes next
            library_stats=(lambda: library.latest("stats")) if library is not None else lambda: None,
            progress=progress,
            recorder=recorder,
            console=console,
            evals=evals,
            live=live,
        )
        stop_at = None if config.run.max_seconds is None else time.monotonic() + config.run.max_seconds
        time_is_up = False
        # Serve heals the library's replicas itself; the driver says so from a thread of its own
        serve_health = ServeHealth(LIBRARY_APP, console.note).watching() if library is not None else None
        with live or contextlib.nullcontext(), serve_health or contextlib.nullcontext():
            while True:
                # A dead learner or library writer is restarted here (driver/supervision.py).
                finished = supervisor.finished(learner, timeout_s=POLL_S)
                if library is not None:
                    supervisor.finished(library)
                watch.step()
                for component in (learner, library):  # alive but reading nothing: restarted as if dead
                    if component is not None:
                        supervisor.check_heartbeat(component, watch.groups.get(component.group))
                if finished:
                    break
                if stop_at is not None and time.monotonic() >= stop_at:
                    console.note(
                        f"run.max_seconds ({config.run.max_seconds:g} s) reached: the learner stops after its step"
                    )
                    stop_at, time_is_up = None, True
                if time_is_up:
                    learner.call("stop")  # every poll from here: a learner restarted after the limit stops too
        summaries, stats = watch.summaries, watch.stats
        if evals is not None:  # the last policy's point: actors stop first, so it gets the CPUs
            summaries = pool.stop() or summaries
            pool = None
            evals.on_learner_step(progress.latest.get("learner_step", 0), final=True)
            console.note("final held-out evaluation (the actors have stopped: it gets their CPUs) ...")
            while evals.busy:
                _record_evals(evals.poll(timeout_s=POLL_S), progress, recorder, console)
                _show_eval_progress(evals, progress, console, always_log=True)
    except KeyboardInterrupt:
        console.note(
            "[yellow]stopping: actors abandon the groups in flight, the learner checkpoints, the library snapshots "
            "(Ctrl-C again to exit at once)[/]"
        )
        return 130
    finally:
        with console.phase("stopping: learner checkpoint, library snapshot, Ray"):
            if sizer is not None:
                sizer.close()
            _shutdown(pool, learner, library, recorder, own_ray=config.ray.address is None)
            ray.shutdown()
            client.close()
    _print_summary(run_dir, progress, summaries, stats, console, startup_s)
    return 0


def create_stream_groups(client: redis.Redis, config: SleaConfig) -> list[str]:
    """The groups the run reads (slea/services.py stream_groups), before any actor writes: a group
    created later would miss the entries before it. Returns the stream's other groups (an operator's,
    or a `library` group an older slea made for a run without a library): they hold trimming back."""
    for group in stream_groups(config):
        ensure_group(client, config.stream_key(), group)
    return sorted(set(group_stats(client, config.stream_key())) - set(stream_groups(config)))


def _join_ray(config: SleaConfig, console: RunConsole) -> None:
    """Start a local Ray or join `ray.address`; the driver's metrics go out on Ray's port or their own."""
    from monitoring.ray_metrics import use_ray_metrics
    from slea.cpu_threads import worker_environment

    with console.phase(
        "starting Ray" if config.ray.address is None else f"joining the Ray cluster {config.ray.address}"
    ):
        ray.init(
            address=config.ray.address,
            num_cpus=config.ray.num_cpus if config.ray.address is None else None,
            namespace=RAY_NAMESPACE,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
            logging_level=logging.WARNING,  # our own lines say what starts; Ray's INFO lines would bury them
            runtime_env={"env_vars": worker_environment()},  # waiting OpenMP threads sleep (slea/cpu_threads.py)
        )
    interrupt_on_sigterm()  # back over ray.init()'s own handler: a SIGTERM (a pod's preStop hook) is the graceful stop
    from ray import serve  # noqa: F401  (imported first: importing it sets its driver-side logger to INFO)

    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if config.monitoring.metrics_port is None:
        use_ray_metrics()  # the driver's gauges (stream lag) go out through Ray's metrics port too
    else:
        from monitoring.metrics import serve_metrics

        serve_metrics(config.monitoring.metrics_port, config.monitoring.metrics_host)


def _print_summary(
    run_dir, progress: Progress, summaries: list[dict], stats, console: RunConsole, startup_s: float
) -> None:
    from driver.run_outputs import read_metrics
    from learner.checkpoint import latest_checkpoint

    entries = read_metrics(run_dir)
    evaluations = [entry for entry in entries if "eval/success_rate" in entry]
    checkpoint = latest_checkpoint(run_dir / "learner" / "checkpoints")
    lines = summary_lines(evaluations, progress, summaries, stats, run_dir, checkpoint, console.elapsed())
    lines.insert(2, time_line(entries, summaries, startup_s, console.elapsed()))
    console.line("[green]done[/]: " + lines[0])
    for line in lines[1:]:
        console.line("  " + line)


class Watch:
    """What the driver does every poll while the run goes (driver/train.py _run calls step()
    every POLL_S until the learner returns): supervise the pool, read the stream's lags and trim
    what every group acknowledged, drain the learner's steps into metrics.jsonl and the sinks (one
    log line each off a terminal), apply `slea scale` and the autoscaler, feed the evaluator, and
    redraw the live table. Its collaborators come in as arguments, so one step is tested alone
    (tests/driver/test_train.py)."""

    def __init__(
        self,
        config: SleaConfig,
        client,
        pool,
        sizer,
        *,
        drain_learner: Callable[[], list[dict]],
        library_stats: Callable[[], dict | None],
        progress: Progress,
        recorder,
        console: RunConsole,
        evals=None,
        live: Live | None = None,
    ):
        self.config, self.client, self.pool, self.sizer = config, client, pool, sizer
        self.stream = config.stream_key()
        self.trimmed_groups = list(stream_groups(config))
        self.drain_learner, self.library_stats = drain_learner, library_stats
        self.progress, self.recorder, self.console, self.evals, self.live = progress, recorder, console, evals, live
        self.summaries: list[dict] = []  # the actor workers' latest summaries
        self.stats: dict | None = None  # the library's latest sizes and version
        self.groups: dict[str, GroupStats] = {}  # the stream's consumer groups at the latest poll

    def _groups_and_trim(self) -> dict[str, GroupStats]:
        """The stream's consumer groups, after trimming what every group acknowledged (Redis may be
        restarting on its AOF: the caller retries, as every component does)."""
        groups = group_stats(self.client, self.stream)
        trim_acknowledged(self.client, self.stream, self.trimmed_groups)
        return groups

    def step(self) -> list[dict]:
        """One poll; returns the learner steps it drained."""
        for index, why in self.pool.supervise():  # Ray restarts a dead worker; the driver counts it and says so
            metric("run_component_restarts_total").labels(component="actor_worker").inc()
            self.console.note(
                f"[yellow]actor worker {index} restarted[/] ({why}): its episodes in flight are marked abandoned"
            )
        self.groups = with_reconnect(self._groups_and_trim, max_wait_s=self.config.redis.reconnect_max_s)
        lags = {name: group.lag for name, group in self.groups.items()}
        self.stats = self.library_stats()
        self.summaries = self.pool.summaries()
        learner_steps = self.drain_learner()
        self.sizer.update(self.summaries, learner_steps)
        for metrics in learner_steps:
            self.progress.add_step(metrics)
            line = run_metrics(metrics, lags, self.stats, self.summaries)
            self.recorder.record(metrics["learner_step"], line)
            if not self.console.console.is_terminal:  # logs (CI, kubectl logs) get one line per step instead
                self.console.note(self.progress.log_line(line))
            if self.evals is not None:
                self.evals.on_learner_step(metrics["learner_step"])
        if self.evals is not None:
            _record_evals(self.evals.poll(), self.progress, self.recorder, self.console)
            _show_eval_progress(self.evals, self.progress, self.console)
        if self.live is not None:
            self.live.update(self.progress.table(self.summaries, lags.get("learner", 0), self.stats))
        return learner_steps


def _start_library(config: SleaConfig, run_dir):
    """The library writer, supervised (a new one restores the latest snapshot), and the Serve app."""
    from driver.supervision import Supervised, snapshot_text
    from library.process import LibraryProcess
    from library.service import start_serve_app

    def start():
        writer = LibraryProcess.options(
            num_cpus=1, resources=dict(config.library.resources) or None, **gpu_options(0)
        ).remote(config.model_dump(mode="json"), config.redis.url, str(run_dir))
        return [writer], [writer.run.remote()]

    library = Supervised(
        "library writer", start, lambda: snapshot_text(run_dir), group="library", runs_until_stopped=True
    )
    library.launch()
    start_serve_app(config, config.redis.url)  # replicas need no library yet: they answer 503 until it is published
    return library


def _start_learner(config: SleaConfig, run_dir):
    """The learner's ranks, supervised: a new set resumes from the latest checkpoint and re-reads
    the stream entries pending for it. The driver talks to rank 0; the other ranks follow it."""
    from driver.supervision import Supervised, checkpoint_text
    from learner.memory import LearnerMemoryError
    from learner.process import start_learner

    def start():
        ranks = start_learner(
            config,
            num_cpus=config.learner.num_cpus,
            resources=dict(config.learner.resources) or None,
            **gpu_options(config.learner.num_gpus),
        )
        return ranks, [rank.run.remote() for rank in ranks]

    learner = Supervised("learner", start, lambda: checkpoint_text(run_dir / "learner"), group="learner")
    try:
        learner.launch()
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, LearnerMemoryError):  # a setting that cannot fit: retrying cannot help
            raise ConfigError(str(exc.cause)) from None
        raise
    return learner


def _learner_when_loaded(loaded: Future, started: float, doing: str, console: RunConsole):
    """The supervised learner `loaded` gives with the monotonic time it finished (waiting for it, with
    a spinner, if it has not loaded yet), and its start-up line with how long it took from `started`."""
    if not loaded.done():
        with console.phase("waiting for the learner to load"):
            wait([loaded])
    learner, finished = loaded.result()
    console.note(f"{doing}: done in {finished - started:.1f} s")
    return learner


def _check_gpus(config: SleaConfig, console: RunConsole) -> None:
    """Refuse (local Ray) or warn about (a cluster, which an autoscaler may grow) GPU requests that no
    node can place, before a Ray actor waits for them (driver/gpu_placement.py)."""
    from driver.gpu_placement import cluster_gpus_per_node, gpu_shortfall

    shortfall = gpu_shortfall(config, cluster_gpus_per_node())
    if shortfall is None:
        return
    if config.ray.address is None:
        raise ConfigError(shortfall)
    console.note(f"[yellow]warning[/]: {shortfall} (unless an autoscaler adds GPU nodes)")


def _start_evaluator(config: SleaConfig, run_dir):
    """The held-out evaluator and its schedule, or None when `eval.every` is 0."""
    if config.eval.every == 0:
        return None
    from driver.train_eval import EvalSchedule, PanelEvaluator

    evaluator = PanelEvaluator.options(num_cpus=config.eval.num_cpus, **gpu_options(config.eval.num_gpus)).remote(
        config.model_dump(mode="json"), str(run_dir)
    )
    return EvalSchedule(evaluator, config.eval.every)


def _record_evals(finished: list[tuple[int, dict]], progress: Progress, recorder, console: RunConsole) -> None:
    from driver.train_eval import HEADLINE

    for learner_step, metrics in finished:
        recorder.record(learner_step, metrics)
        progress.latest_eval = (learner_step, metrics.get(HEADLINE))
        alone = metrics.get("eval/sampled/no_library/success_rate")
        with_library = "eval/sampled/library/success_rate" in metrics
        console.note(
            f"held-out evaluation at step {learner_step} (policy v{metrics['eval/policy_version']}): success "
            f"{metrics.get(HEADLINE, float('nan')):.0%}"
            + (f", without the library {alone:.0%}" if with_library and alone is not None else "")
            + ("" if with_library else " (the policy alone)")
            + f" ({metrics['eval/seconds']:.0f} s)"
        )


def _show_eval_progress(evals, progress: Progress, console: RunConsole, always_log: bool = False) -> None:
    """The running evaluation's episode count: in the live table, and as a line in logs (or when
    nothing else is on the screen, during the final evaluation)."""
    line = progress.eval_progress(evals.progress())
    if line is not None and (always_log or not console.console.is_terminal):
        console.note(line)


def _recorder(config: SleaConfig, run_dir):
    from driver.run_outputs import RunRecorder
    from driver.sinks import open_sinks

    return RunRecorder(run_dir, sinks=open_sinks(config, run_dir), plots=config.monitoring.plots)


def _shutdown(pool, learner, library, recorder, own_ray: bool) -> None:
    """Graceful order: no new groups -> learner checkpoint -> library snapshot -> Serve app down. A dead
    learner (the run stopping past run.max_failures) does not keep the library from its snapshot.

    The retrieval app goes with `serve.delete` on a cluster (whose Serve is not ours to stop), and with
    the local Ray that `ray.shutdown()` ends next (own_ray). Never `serve.shutdown()`: its
    `graceful_shutdown` call waits, by design, until the controller is killed (ray/serve/_private/
    controller.py), and the driver then prints Ray's "(raylet) Task ServeController.graceful_shutdown
    failed ... will be retried" as the run's last word."""
    if pool is not None:
        pool.stop()
    if learner is not None and learner.handles:  # one restarting has nothing newer than its checkpoint
        learner.head.stop.remote()
        ray.wait(learner.runs, num_returns=len(learner.runs), timeout=LEARNER_CHECKPOINT_WAIT_S)
        for metrics in learner.call("drain_metrics", default=[]):
            recorder.record(metrics["learner_step"], run_metrics(metrics, {}, None))
    if library is not None and library.handles:
        library.head.stop.remote()
        ray.wait(library.runs, timeout=LIBRARY_SNAPSHOT_WAIT_S)
        if not own_ray:
            from ray import serve

            serve.delete(LIBRARY_APP)
    recorder.close()
