"""Held-out evaluation while training: the curve that says whether the policy is learning.

Every `eval.every` learner steps (and once before the first update, and once after the last)
a `PanelEvaluator` Ray actor loads the newest published weights from the run's weight
registry into its own engine and plays the env's held-out panel exactly as `slea eval` does
(same panel, same step budget, sampled and greedy, with the run's live library when it has
one and without). Training never waits for it: one evaluation runs at a time, and a request
that arrives while one runs replaces any request still queued, so the evaluator always
measures the newest policy it can.

Each evaluation becomes one metrics.jsonl line at its learner step (run_outputs merges it
with the learner's line for that step) and a full report under `<run>/eval/step-<s>-v<v>/`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import ray

from slea.channels import LibraryNotPublished
from slea.config import SleaConfig

log = logging.getLogger(__name__)

LIBRARY_LISTING = "library.md"  # beside each report played with the library: what the library held
HEADLINE = "eval/success_rate"  # sampled success, with the library when the run has one (the deployed policy)


def eval_metrics(report: dict, with_library: bool) -> dict[str, float]:
    """Flat metrics of one panel report: `eval/<decoding>/<library|no_library>/<what>` for every
    played row, plus the headline `eval/success_rate` and its per-task-type series."""
    metrics: dict[str, float] = {}
    for row in report["rows"]:
        if not row["available"]:
            continue
        prefix = f"eval/{row['decoding']}/{'library' if row['library'] else 'no_library'}"
        metrics[f"{prefix}/success_rate"] = row["success_rate"]
        metrics[f"{prefix}/mean_steps"] = row["mean_steps"]
        metrics[f"{prefix}/invalid_action_rate"] = row["invalid_action_rate"]
        if row["decoding"] == "sampled" and row["library"] == with_library:
            metrics[HEADLINE] = row["success_rate"]
            for task_type, rate in row["success_by_task_type"].items():
                metrics[f"{HEADLINE}/{task_type}"] = rate
    metrics["eval/policy_version"] = report["policy_version"]
    return metrics


# A killed evaluator (memory) comes back for the next request; a second thread answers `progress`.
@ray.remote(max_restarts=-1, max_task_retries=0, max_concurrency=2)
class PanelEvaluator:
    """Owns one engine and plays the held-out panel with whatever weights the learner published last,
    or, before the first update, with the initial weights it was built with."""

    def __init__(self, config: dict, run_dir: str):
        from actors.engines import SamplingSettings, make_engine
        from slea.cpu_threads import use_assigned_cpus

        use_assigned_cpus()

        self.config = SleaConfig.model_validate(config)
        if self.config.eval.panel_size is not None:
            self.config.envs.panel_size = self.config.eval.panel_size
        self.run_dir = Path(run_dir)
        self.env_pool: list = []  # envs kept across evaluations (actors/evaluation/panel.py says why)
        self._progress: tuple[int, int, int] | None = None  # (learner step, episodes played, in all) while evaluating
        model = self.config.model
        self.engine = make_engine(
            self.config.eval.engine or self.config.actors.engine,
            model.name,
            SamplingSettings(temperature=model.temperature, top_p=model.top_p, max_new_tokens=model.max_new_tokens),
            dtype=self.config.actors.dtype,
            max_batch=self.config.eval.max_batch,
            engine_args=self.config.actors.engine_args,
        )

    def _load_latest_weights(self, timeout_s: float = 300.0) -> int:
        """Stage the registry's newest weights into the engine; returns their version."""
        from slea.channels import RAY_NAMESPACE, weight_registry_name

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                registry = ray.get_actor(weight_registry_name(self.config.run.id), namespace=RAY_NAMESPACE)
                latest = ray.get(registry.get_latest.remote(0))
            except ValueError:  # the learner has not created the registry yet
                latest = None
            if latest is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no weights published for run {self.config.run.id} within {timeout_s:.0f} s")
            time.sleep(1.0)
        version, ref = latest
        if version != self.engine.policy_version:
            self.engine.update_weights(ray.get(ref), version)
        return version

    def _library_app(self):
        """The handle of the run's live library app, or None (no library, or it is not up)."""
        if not (self.config.library.enabled and self.config.eval.library):
            return None
        from driver.eval_library import running_library_app

        return running_library_app()

    def evaluate(self, learner_step: int) -> dict:
        """Play the panel with the newest weights; returns the flat metrics (see eval_metrics).

        Before the first update (step 0) the panel is played with the engine's initial weights,
        version 0, not the registry's newest: on a busy machine the learner can publish its first
        update before this evaluation starts (a CI run measured "step 0" at version 1). And it is
        played without the library: it is empty then, or holds only what training added while
        this evaluation waited, so a with-library row would measure neither the base policy nor a
        trained one."""
        from driver.eval_library import retrieval_client_for
        from driver.evaluate import evaluate_engine

        if learner_step == 0 and self.engine.policy_version != 0:
            raise RuntimeError(
                f"the step-0 evaluation needs the initial weights; the engine holds v{self.engine.policy_version}"
            )
        version = 0 if learner_step == 0 else self._load_latest_weights()
        cfg = self.config
        library_app = self._library_app() if learner_step > 0 else None
        retrieval = retrieval_client_for(cfg, library_app) if library_app is not None else None
        note = "the run's live library" if retrieval is not None else "the run has no library"
        if learner_step == 0 and cfg.library.enabled:
            note = "not played before the first update: the library starts empty"
        out_dir = self.run_dir / "eval" / f"step-{learner_step:05d}-v{version:05d}"
        if library_app is not None:
            self._list_library(library_app, out_dir)
        started = time.monotonic()
        try:
            report = evaluate_engine(
                self.engine,
                cfg,
                samples_per_task=cfg.eval.samples_per_task,
                retrieval=retrieval,
                library_note=note,
                out_dir=out_dir,
                facts={"model": cfg.model.name, "learner_step": learner_step, "policy_version": version},
                env_pool=self.env_pool,
                on_episode=lambda played, episodes: setattr(self, "_progress", (learner_step, played, episodes)),
                greedy=cfg.eval.greedy,
                policy_alone=cfg.eval.policy_alone,
            ).report
        finally:
            self._progress = None
        metrics = eval_metrics(report, with_library=retrieval is not None)
        metrics["eval/seconds"] = time.monotonic() - started
        return metrics

    def _list_library(self, library_app, out_dir: Path) -> None:
        """`library.md`: what the library this evaluation plays with holds as it starts (the Serve
        app's live listing), so a study can show what the library held at each evaluation (the
        final snapshot alone cannot). A library not published yet is said in the file instead."""
        from driver.eval_library import EVAL_RETRIEVAL_TIMEOUT_S

        try:
            listing = library_app.listing.remote(3).result(timeout_s=EVAL_RETRIEVAL_TIMEOUT_S)
        except LibraryNotPublished as exc:
            listing = f"no library to list: {exc}"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / LIBRARY_LISTING).write_text(listing + "\n")

    def progress(self) -> tuple[int, int, int] | None:
        """(learner step, episodes played, episodes in all) of the evaluation running now, else None."""
        return self._progress


class EvalSchedule:
    """The driver's side: when to ask for an evaluation and what came back.

    One evaluation in flight; a newer request waits in a one-slot queue (replacing an older
    waiting one). `poll()` returns finished (learner_step, metrics) pairs.
    """

    def __init__(self, evaluator, every: int):
        self.evaluator = evaluator
        self.every = every
        self._running: tuple[int, ray.ObjectRef] | None = None
        self._queued: int | None = None
        self.requested: set[int] = set()
        self.failed: list[int] = []  # learner steps whose evaluation failed (the run goes on without them)

    def on_learner_step(self, learner_step: int, final: bool = False) -> None:
        if learner_step in self.requested or not (final or learner_step % self.every == 0):
            return
        self.requested.add(learner_step)
        self._queued = learner_step
        self._start_queued()

    def _start_queued(self) -> None:
        if self._running is None and self._queued is not None:
            self._running = (self._queued, self.evaluator.evaluate.remote(self._queued))
            self._queued = None

    def poll(self, timeout_s: float = 0.0) -> list[tuple[int, dict]]:
        """Finished evaluations, waiting up to `timeout_s` for the running one."""
        if self._running is None:
            return []
        step, ref = self._running
        ready, _ = ray.wait([ref], timeout=timeout_s)
        if not ready:
            return []
        self._running = None
        self._start_queued()
        try:
            return [(step, ray.get(ref))]
        except ray.exceptions.RayError as exc:  # the evaluator died or failed: training goes on without this point
            log.warning("held-out evaluation of learner step %d failed: %s", step, exc)
            self.failed.append(step)
            return []

    def progress(self) -> tuple[int, int, int] | None:
        """The running evaluation's (learner step, episodes played, in all), or None."""
        if self._running is None:
            return None
        try:
            return ray.get(self.evaluator.progress.remote(), timeout=5)
        except (ray.exceptions.RayError, TimeoutError):  # restarting, or busy loading weights: no news
            return None

    @property
    def busy(self) -> bool:
        return self._running is not None or self._queued is not None
