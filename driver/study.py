"""`slea compare --by-preset`: a learning study's arms, each with a 95% confidence interval.

Runs of one preset (with or without `run.edge`) are the seeds of one arm. Every held-out episode a
run played is read back (`eval/step-*/report.json`, or the kept copy `episodes.jsonl`), summed per
run and panel task, and three figures are estimated per arm and evaluation step: success, the
inadmissible-action rate (invalid steps over steps) and the mean episode reward; each in two views,
"deployed" (sampled, with the run's library when it has one, as the run's headline) and
"policy alone" (sampled, no library). The evaluation before the first update (step 0) played the
base model, which every arm starts from: its episodes form the arm "base model".

The interval is a percentile bootstrap over both sources of variation: each draw resamples the
arm's seeds with replacement and the panel's tasks with replacement, and recomputes the ratio of
sums over the drawn (seed, task) cells. A difference between two arms that played the same panel
is paired by task: both arms draw the same tasks in each resample, so what a task does to every arm
(a hard game is hard for all) cancels; their seeds are drawn independently, although two arms'
runs of one seed share their rollouts until their prompts or advantages first differ (the same
base model, sampler seed and games): drawing them apart gives up that pairing, so a difference's
interval is, if anything, too wide. Arms on different panels draw their tasks independently.

Where this differs from common practice, and why: rliable (Agarwal et al., 2021) bootstraps runs
stratified by task with per-task scores as fixed; here the tasks are resampled too, because the
panel is itself a sample of the env's games and the claim is about the env, not these 48 games.
With one seed the interval reflects only the tasks and the episodes' sampling, and says so (n).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from driver.library_report import library_report
from driver.run_outputs import draw_lines, run_section

BASE = "base model"  # the arm of the step-0 evaluations: the policy before any update
EPISODES_FILE = "episodes.jsonl"  # a kept run's episodes, one JSON line each, with its learner_step
DRAWS = 4000
LEVEL = 0.95
# figure -> (episode field summed on top, field summed below or None for one per episode), unit interval
METRICS = {
    "success": ("success", None, True),
    "invalid_action_rate": ("invalid_steps", "steps", True),
    "mean_reward": ("total_reward", None, False),
}
# Arms in table order; a pair's difference is the earlier arm minus the later (GRPO, the baseline, last).
ARM_ORDER = ("slea", "slea+edge", "task_retrieval", "task_retrieval+edge", "grpo", "grpo+edge")
VIEWS = {"deployed": "sampled, with the run's library where it has one", "policy_alone": "sampled, no library"}


@dataclass
class Cells:
    """One arm's episodes at one evaluation step in one view, summed per seed (run) and task."""

    runs: list[str]  # [S] run ids: the arm's seeds
    tasks: list[str]  # [T] panel task ids, sorted
    numerator: np.ndarray  # [S, T] summed numerator (wins, invalid steps or reward)
    denominator: np.ndarray  # [S, T] summed denominator (episodes, or steps)

    def statistic(self) -> float:
        return float(self.numerator.sum() / self.denominator.sum())


@dataclass(frozen=True)
class Estimate:
    """A figure with its bootstrap interval."""

    mean: float  # on all the data
    low: float  # the interval's lower end (2.5th percentile of the draws)
    high: float  # its upper end (97.5th percentile)
    seeds: int  # runs behind it (for a difference: the smaller arm's)


def resample_counts(rng: np.random.Generator, size: int, draws: int) -> np.ndarray:
    """[draws, size] how often each of `size` items appears in each draw of `size` with replacement."""
    return rng.multinomial(size, np.full(size, 1.0 / size), size=draws)


def _drawn(cells: Cells, seed_counts: np.ndarray, task_counts: np.ndarray) -> np.ndarray:
    """[draws] the ratio of sums over each draw's (seed, task) cells, each cell weighted by its counts."""
    top = np.einsum("bs,st,bt->b", seed_counts, cells.numerator, task_counts)
    bottom = np.einsum("bs,st,bt->b", seed_counts, cells.denominator, task_counts)
    return top / bottom


def _interval(mean: float, draws: np.ndarray, seeds: int) -> Estimate:
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Estimate(mean, float(low), float(high), seeds)


def estimate(cells: Cells, draws: int = DRAWS, seed: int = 0) -> Estimate:
    """The arm's figure with its interval (seeds and tasks resampled)."""
    rng = np.random.default_rng(seed)
    seed_counts = resample_counts(rng, len(cells.runs), draws)
    task_counts = resample_counts(rng, len(cells.tasks), draws)
    return _interval(cells.statistic(), _drawn(cells, seed_counts, task_counts), len(cells.runs))


def difference(first: Cells, second: Cells, draws: int = DRAWS, seed: int = 0) -> Estimate:
    """first - second with its interval; paired by task when both played the same panel."""
    rng = np.random.default_rng(seed)
    first_tasks = resample_counts(rng, len(first.tasks), draws)
    second_tasks = first_tasks if first.tasks == second.tasks else resample_counts(rng, len(second.tasks), draws)
    drawn = _drawn(first, resample_counts(rng, len(first.runs), draws), first_tasks) - _drawn(
        second, resample_counts(rng, len(second.runs), draws), second_tasks
    )
    return _interval(first.statistic() - second.statistic(), drawn, min(len(first.runs), len(second.runs)))


def arm_of(run_dir: Path) -> tuple[str, str]:
    """(run id, arm label) from the run's config.yaml: the preset, "+edge" when `run.edge` was on."""
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir} has no config.yaml: not a run directory (or not a kept one)")
    run = run_section(run_dir)
    return run.get("id", run_dir.name), run.get("preset", "?") + ("+edge" if run.get("edge") else "")


def run_episodes(run_dir: Path) -> list[dict]:
    """Every held-out episode the run played, each with the `learner_step` of its evaluation."""
    kept = run_dir / EPISODES_FILE
    if kept.is_file():
        return [json.loads(line) for line in kept.read_text().splitlines() if line.strip()]
    episodes = []
    for report_file in sorted(run_dir.glob("eval/step-*/report.json")):
        report = json.loads(report_file.read_text())
        episodes += [{**episode, "learner_step": report["learner_step"]} for episode in report["episodes"]]
    if not episodes:
        raise ValueError(
            f"{run_dir} has no held-out episodes (no eval/step-*/report.json, no {EPISODES_FILE}): "
            "it ran no evaluation, or its evaluations were recorded before per-episode reports"
        )
    return episodes


def keep_episodes(run_dir: Path, kept_dir: Path) -> Path:
    """Write the run's episodes to `kept_dir/episodes.jsonl` (the committed copy of a study's run)."""
    path = kept_dir / EPISODES_FILE
    path.write_text("".join(json.dumps(episode, sort_keys=True) + "\n" for episode in run_episodes(run_dir)))
    return path


def _in_view(episodes: list[dict], view: str) -> list[dict]:
    """The episodes of one view at one step: sampled; "deployed" takes the library's when there are any."""
    sampled = [episode for episode in episodes if episode["decoding"] == "sampled"]
    with_library = [episode for episode in sampled if episode["library"]]
    if view == "deployed" and with_library:
        return with_library
    return [episode for episode in sampled if not episode["library"]]


def cells_of(runs: dict[str, list[dict]], metric: str) -> Cells:
    """Sum `runs` (run id -> its episodes of one step and view) per run and task for `metric`."""
    top, bottom, _ = METRICS[metric]
    tasks = sorted({episode["task_id"] for episodes in runs.values() for episode in episodes})
    index = {task: column for column, task in enumerate(tasks)}
    numerator = np.zeros((len(runs), len(tasks)))
    denominator = np.zeros((len(runs), len(tasks)))
    for row, episodes in enumerate(runs.values()):
        for episode in episodes:
            numerator[row, index[episode["task_id"]]] += float(episode[top])
            denominator[row, index[episode["task_id"]]] += float(episode[bottom]) if bottom else 1.0
    return Cells(list(runs), tasks, numerator, denominator)


def study_cells(run_dirs: list[str | Path]) -> dict[tuple[str, str, int], dict[str, list[dict]]]:
    """(arm, view, learner step) -> run id -> that run's episodes; step 0 belongs to the base model."""
    found: dict[tuple[str, str, int], dict[str, list[dict]]] = {}
    seen: dict[str, Path] = {}
    for run_dir in map(Path, run_dirs):
        run_id, arm = arm_of(run_dir)
        if run_id in seen:
            raise ValueError(f"run id '{run_id}' appears twice ({seen[run_id]} and {run_dir}): one seed counted twice")
        seen[run_id] = run_dir
        by_step: dict[int, list[dict]] = {}
        for episode in run_episodes(run_dir):
            by_step.setdefault(int(episode["learner_step"]), []).append(episode)
        for step, episodes in by_step.items():
            for view in VIEWS:
                chosen = _in_view(episodes, view)
                if chosen:
                    found.setdefault((BASE if step == 0 else arm, view, step), {})[run_id] = chosen
    return found


def _fmt(value: Estimate, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{value.mean:{sign}.3f} [{value.low:{sign}.3f}, {value.high:{sign}.3f}]"


def study_report(run_dirs: list[str | Path], out_dir: str | Path, draws: int = DRAWS) -> tuple[str, list[Path]]:
    """Markdown tables (per view and figure: each arm per step; each pair of arms, and each arm against
    the base model, per step) and one plot per view and figure with the intervals shaded."""
    found = study_cells(run_dirs)
    arms = sorted(
        {arm for arm, _, _ in found if arm != BASE},
        key=lambda arm: (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm),
    )
    steps = sorted({step for _, _, step in found})
    out = Path(out_dir)
    lines = [
        f"Means with {LEVEL:.0%} bootstrap intervals over seeds and tasks ({draws} draws; differences paired by "
        "task where both arms played the same panel; n = seeds).",
    ]
    plots = []
    for view, metric in itertools.product(VIEWS, METRICS):
        cells = {
            (arm, step): cells_of(runs, metric) for (arm, cell_view, step), runs in found.items() if cell_view == view
        }
        if not cells:
            continue
        estimates = {key: estimate(value, draws) for key, value in cells.items()}
        lines += ["", f"### {metric.replace('_', ' ')}, {view.replace('_', ' ')} ({VIEWS[view]})", ""]
        lines += [f"| arm | {' | '.join(f'step {step}' for step in steps)} |", "|---" * (len(steps) + 1) + "|"]
        for arm in [BASE, *arms]:
            row = [_cell(estimates.get((arm, step))) for step in steps]
            if any(cell != "-" for cell in row):
                lines.append(f"| {arm} | {' | '.join(row)} |")
        pairs = [(first, second) for first, second in itertools.combinations(arms, 2)] + [(arm, BASE) for arm in arms]
        lines += ["", f"| difference | {' | '.join(f'step {step}' for step in steps if step > 0)} |"]
        lines.append("|---" * (sum(step > 0 for step in steps) + 1) + "|")
        for first, second in pairs:
            row = []
            for step in (step for step in steps if step > 0):
                other = cells.get((second, 0 if second == BASE else step))
                mine = cells.get((first, step))
                row.append("-" if mine is None or other is None else _fmt(difference(mine, other, draws), signed=True))
            if any(cell != "-" for cell in row):
                lines.append(f"| {first} - {second} | {' | '.join(row)} |")
        plots.append(_plot(estimates, arms, out / f"{view}_{metric}.png", view, metric))
    runs_by_arm: dict[str, list[Path]] = {arm: [] for arm in arms}
    for run_dir in map(Path, run_dirs):
        runs_by_arm.setdefault(arm_of(run_dir)[1], []).append(run_dir)
    learned = library_report(runs_by_arm)
    if learned:
        lines += ["", "## What the library learned", "", learned]
    return "\n".join(lines), plots


def _cell(value: Estimate | None) -> str:
    return "-" if value is None else f"{_fmt(value)} (n={value.seeds})"


def _plot(estimates: dict[tuple[str, int], Estimate], arms: list[str], path: Path, view: str, metric: str) -> Path:
    """Each arm's mean over its evaluation steps, from the base model at step 0, its interval shaded."""
    base = estimates.get((BASE, 0))
    lines, bands = {}, {}
    for arm in arms:
        points = sorted((step, value) for (name, step), value in estimates.items() if name == arm)
        if base is not None:
            points = [(0, base), *points]
        lines[arm] = ([step for step, _ in points], [value.mean for _, value in points])
        bands[arm] = ([value.low for _, value in points], [value.high for _, value in points])
    title = f"held-out {metric.replace('_', ' ')}, {view.replace('_', ' ')} (mean, {LEVEL:.0%} interval shaded)"
    draw_lines(lines, path, title, metric.replace("_", " "), unit_interval=METRICS[metric][2], bands=bands)
    return path
