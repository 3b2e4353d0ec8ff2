"""`slea compare --by-preset`: a learning study's arms and their differences, each with two intervals.

Runs of one preset (with or without `run.edge`) are the seeds of one arm. Every held-out episode a
run played is read back (`eval/step-*/report.json`, or the kept copy `episodes.jsonl`), summed per
run and panel task, and three figures are estimated per arm and evaluation step: success, the
inadmissible-action rate (invalid steps over steps) and the mean episode reward; each in two views,
"deployed" (sampled, with the run's library when it has one, as the run's headline) and
"policy alone" (sampled, no library). The evaluation before the first update (step 0) played the
base model, which every arm starts from: its episodes, pooled over every run that played it,
form the arm "base model". Runs are compared only under one evaluation protocol (the same env,
panel, model sampling and prompt: `protocol_of`), so the pooled base model is one protocol's.

Two intervals, for two questions:

- **Over seeds** (the headline; driver/seed_intervals.py): each run's figure over the whole panel
  is one draw of its training seed, and a t interval over them carries the variance between
  seeds, which in the study is most of it. A difference between arms that ran the same seeds is
  taken per seed (paired: the seed's runs share their task stream), else by Welch's t; an arm
  against the base model is its runs minus the pooled base figure, whose own evaluation noise (its
  episodes' sampling, per task) is added. With one seed there is none.
- **Over tasks** (evaluation noise for these seeds): a percentile bootstrap over the panel's games,
  the runs held fixed, recomputing the ratio of sums over the drawn (run, task) cells; a difference
  between arms on one panel draws the same games for both (paired by task, so what a game does to
  every arm cancels). It says how far another evaluation of these same trained policies could
  move the figure, not how far another seed could: it is not the interval of a claim about an arm.

Why the seed is the unit: the study's first analysis (the history in docs/learning.md) bootstrapped
2-3 seeds with replacement and the tasks together. A bootstrap over n seeds sees (n - 1) / n of
their variance and has no small-sample correction (a t interval over 2 seeds uses 12.7, not 1.96),
and two seeds that scored alike held no seed variance at all: its intervals were too narrow.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from driver.library_report import library_report
from driver.run_outputs import draw_lines, run_section
from driver.seed_intervals import LEVEL, SeedInterval, minus_estimate, over_seeds, seed_difference

BASE = "base model"  # the arm of the step-0 evaluations: the policy before any update
EPISODES_FILE = "episodes.jsonl"  # a kept run's episodes, one JSON line each, with its learner_step
DRAWS = 4000
# figure -> (episode field summed on top, field summed below or None for one per episode), unit interval
METRICS = {
    "success": ("success", None, True),
    "invalid_action_rate": ("invalid_steps", "steps", True),
    "mean_reward": ("total_reward", None, False),
}
# Arms in table order; a pair's difference is the earlier arm minus the later (GRPO, the baseline, last).
ARM_ORDER = ("slea", "slea+edge", "task_retrieval", "task_retrieval+edge", "grpo", "grpo+edge")
VIEWS = {"deployed": "sampled, with the run's library where it has one", "policy_alone": "sampled, no library"}
# What makes two runs' held-out figures comparable: the games and limits, the model's sampling and
# prompt, episodes per task. config.yaml section -> its keys that count (None: the whole section).
PROTOCOL = {
    "envs": None,
    "model": ("name", "temperature", "max_new_tokens", "max_prompt_tokens"),
    "actors": ("prompt_style", "prompt_layout", "history_length"),
    "eval": ("samples_per_task",),
}
# What a key of PROTOCOL was before the config had it: a run kept then played that.
PROTOCOL_BEFORE_THE_KEY = {("actors", "prompt_layout"): "experiences_first"}
TASK_COLUMN = "over tasks (evaluation noise for these seeds)"


@dataclass
class Cells:
    """One arm's episodes at one evaluation step in one view, summed per seed (run) and task."""

    runs: list[str]  # [S] run ids: the arm's seeds
    tasks: list[str]  # [T] panel task ids, sorted
    numerator: np.ndarray  # [S, T] summed numerator (wins, invalid steps or reward)
    denominator: np.ndarray  # [S, T] summed denominator (episodes, or steps)

    def statistic(self) -> float:
        return float(self.numerator.sum() / self.denominator.sum())

    def per_run(self) -> np.ndarray:
        """[S] each run's own figure over the whole panel: the draws the seed-level interval is over."""
        return self.numerator.sum(axis=1) / self.denominator.sum(axis=1)


@dataclass(frozen=True)
class Estimate:
    """A figure with its bootstrap interval over tasks."""

    mean: float  # on all the data
    low: float  # the interval's lower end (2.5th percentile of the draws)
    high: float  # its upper end (97.5th percentile)
    seeds: int  # runs behind it (for a difference: the smaller arm's)


def resample_counts(rng: np.random.Generator, size: int, draws: int) -> np.ndarray:
    """[draws, size] how often each of `size` items appears in each draw of `size` with replacement."""
    return rng.multinomial(size, np.full(size, 1.0 / size), size=draws)


def _drawn(cells: Cells, task_counts: np.ndarray) -> np.ndarray:
    """[draws] the ratio of sums over every run and each draw's tasks, each task weighted by its count."""
    top = np.einsum("st,bt->b", cells.numerator, task_counts)
    bottom = np.einsum("st,bt->b", cells.denominator, task_counts)
    return top / bottom


def _interval(mean: float, draws: np.ndarray, seeds: int) -> Estimate:
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Estimate(mean, float(low), float(high), seeds)


def estimate(cells: Cells, draws: int = DRAWS, seed: int = 0) -> Estimate:
    """The arm's figure with its interval over tasks (the runs held fixed)."""
    task_counts = resample_counts(np.random.default_rng(seed), len(cells.tasks), draws)
    return _interval(cells.statistic(), _drawn(cells, task_counts), len(cells.runs))


def difference(first: Cells, second: Cells, draws: int = DRAWS, seed: int = 0) -> Estimate:
    """first - second with its interval over tasks; paired by task when both played the same panel."""
    rng = np.random.default_rng(seed)
    first_tasks = resample_counts(rng, len(first.tasks), draws)
    second_tasks = first_tasks if first.tasks == second.tasks else resample_counts(rng, len(second.tasks), draws)
    drawn = _drawn(first, first_tasks) - _drawn(second, second_tasks)
    return _interval(first.statistic() - second.statistic(), drawn, min(len(first.runs), len(second.runs)))


def arm_of(run_dir: Path) -> tuple[str, str]:
    """(run id, arm label) from the run's config.yaml: the preset, "+edge" when `run.edge` was on."""
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir} has no config.yaml: not a run directory (or not a kept one)")
    run = run_section(run_dir)
    return run.get("id", run_dir.name), run.get("preset", "?") + ("+edge" if run.get("edge") else "")


def protocol_of(run_dir: Path) -> str:
    """The run's evaluation protocol (PROTOCOL's config keys) as canonical JSON: equal for comparable runs."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    protocol = {}
    for section, keys in PROTOCOL.items():
        values = config.get(section) or {}
        protocol[section] = (
            values
            if keys is None
            else {key: values.get(key, PROTOCOL_BEFORE_THE_KEY.get((section, key))) for key in keys}
        )
    return json.dumps(protocol, sort_keys=True)


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
    protocols: dict[str, Path] = {}
    for run_dir in map(Path, run_dirs):
        run_id, arm = arm_of(run_dir)
        if run_id in seen:
            raise ValueError(f"run id '{run_id}' appears twice ({seen[run_id]} and {run_dir}): one seed counted twice")
        seen[run_id] = run_dir
        protocols.setdefault(protocol_of(run_dir), run_dir)
        if len(protocols) > 1:
            first, second = protocols.values()
            raise ValueError(
                f"{first} and {second} were evaluated under different protocols (env, panel, sampling or "
                f"prompt: {', '.join(PROTOCOL)} in config.yaml): compare each protocol's runs on their own"
            )
        by_step: dict[int, list[dict]] = {}
        for episode in run_episodes(run_dir):
            by_step.setdefault(int(episode["learner_step"]), []).append(episode)
        for step, episodes in by_step.items():
            for view in VIEWS:
                chosen = _in_view(episodes, view)
                if chosen:
                    found.setdefault((BASE if step == 0 else arm, view, step), {})[run_id] = chosen
    return found


def evaluation_variance(runs: dict[str, list[dict]], metric: str) -> tuple[float, float]:
    """(variance, degrees of freedom) of the pooled figure of `runs`' episodes from their sampling alone:
    the panel's tasks as strata, a task's episodes as independent draws, the ratio linearised (delta
    method): sum over tasks of k/(k-1) x the within-task sum of squares of x - R d, over the total d
    squared, with sum of (k - 1) degrees of freedom. The base model's evaluation noise, for arm - base."""
    top, bottom, _ = METRICS[metric]
    episodes = [episode for played in runs.values() for episode in played]
    numerator = np.array([float(episode[top]) for episode in episodes])
    denominator = np.array([float(episode[bottom]) if bottom else 1.0 for episode in episodes])
    residual = numerator - numerator.sum() / denominator.sum() * denominator
    by_task: dict[str, list[float]] = {}
    for episode, value in zip(episodes, residual):
        by_task.setdefault(episode["task_id"], []).append(value)
    total, df = 0.0, 0
    for values in (np.array(values) for values in by_task.values() if len(values) > 1):
        total += len(values) / (len(values) - 1) * float(((values - values.mean()) ** 2).sum())
        df += len(values) - 1
    return total / float(denominator.sum()) ** 2, float(df)


def training_seeds(run_dirs: list[str | Path]) -> dict[str, int | None]:
    """run id -> `run.seed`: the runs of one seed share their training task stream."""
    return {arm_of(Path(run_dir))[0]: run_section(run_dir).get("seed") for run_dir in run_dirs}


def _by_seed(cells: Cells, seeds: dict[str, int | None]) -> dict:
    """The arm's per-run figures keyed by training seed (by run id where seeds are missing or repeat:
    nothing to pair on, so a difference falls back to Welch)."""
    keys = [seeds.get(run) for run in cells.runs]
    if None in keys or len(set(keys)) < len(keys):
        keys = list(cells.runs)
    return dict(zip(keys, cells.per_run().tolist()))


def seed_level(
    first: Cells, second: Cells | None, seeds: dict[str, int | None], base_noise: tuple[float, float] | None = None
) -> SeedInterval:
    """The seed-level interval: of `first` alone (second None), of first - the pooled base model
    (base_noise: its evaluation variance and df), or of first - second, paired by training seed where
    they ran the same seeds."""
    if second is None:
        return over_seeds(first.per_run())
    if base_noise is not None:
        return minus_estimate(first.per_run(), second.statistic(), *base_noise)
    return seed_difference(_by_seed(first, seeds), _by_seed(second, seeds))


def _fmt(value: Estimate, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{value.mean:{sign}.3f} [{value.low:{sign}.3f}, {value.high:{sign}.3f}]"


def _seed_fmt(value: SeedInterval, signed: bool = False) -> str:
    sign = "+" if signed else ""
    if value.half_width is None:
        return f"{value.mean:{sign}.3f} (n={value.seeds}: no interval over one seed)"
    method = "" if value.method == "t" else f"{value.method}, "
    agree = ", the seeds agree: width 0 is not evidence of no seed variance" if value.half_width == 0 else ""
    return (
        f"{value.mean:{sign}.3f} ±{value.half_width:.3f} [{value.low:{sign}.3f}, {value.high:{sign}.3f}] "
        f"({method}n={value.seeds}{agree})"
    )


def _header(first: str, steps: list[int]) -> list[str]:
    columns = [f"step {step}, over seeds (t) | step {step}, {TASK_COLUMN}" for step in steps]
    return [f"| {first} | {' | '.join(columns)} |", "|---" * (2 * len(steps) + 1) + "|"]


def study_report(run_dirs: list[str | Path], out_dir: str | Path, draws: int = DRAWS) -> tuple[str, list[Path]]:
    """Markdown tables (per view and figure: each arm per step; each pair of arms, and each arm against
    the base model, per step; every figure over seeds and over tasks) and one plot per view and figure
    with the seed-level intervals shaded."""
    found = study_cells(run_dirs)
    seeds = training_seeds(run_dirs)
    arms = sorted(
        {arm for arm, _, _ in found if arm != BASE},
        key=lambda arm: (ARM_ORDER.index(arm) if arm in ARM_ORDER else len(ARM_ORDER), arm),
    )
    steps = sorted({step for _, _, step in found})
    later = [step for step in steps if step > 0]
    out = Path(out_dir)
    lines = [
        f"Means with {LEVEL:.0%} intervals, two for each. Over seeds: a t interval over the runs (one figure "
        "per run; ± the half-width); a difference is paired by training seed where both arms ran the same "
        "seeds, else Welch's; against the base model, the arm's runs minus the base model's evaluations "
        f"pooled, whose evaluation noise is added. Over tasks: a bootstrap over the panel's games ({draws} draws), the runs held fixed, paired "
        "by game: the evaluation noise for these seeds, not an interval for another seed. n = seeds.",
    ]
    plots = []
    for view, metric in itertools.product(VIEWS, METRICS):
        cells = {
            (arm, step): cells_of(runs, metric) for (arm, cell_view, step), runs in found.items() if cell_view == view
        }
        if not cells:
            continue
        by_tasks = {key: estimate(value, draws) for key, value in cells.items()}
        by_seeds = {key: seed_level(value, None, seeds) for key, value in cells.items() if key[0] != BASE}
        lines += ["", f"### {metric.replace('_', ' ')}, {view.replace('_', ' ')} ({VIEWS[view]})", ""]
        lines += _header("arm", steps)
        for arm in [BASE, *arms]:
            row = []
            for step in steps:
                tasks, key = by_tasks.get((arm, step)), (arm, step)
                if tasks is None:
                    row += ["-", "-"]
                elif arm == BASE:
                    row += [f"{tasks.mean:.3f} (no training seed; pooled, runs: {tasks.seeds})", _fmt(tasks)]
                else:
                    row += [_seed_fmt(by_seeds[key]), f"{_fmt(tasks)} (n={tasks.seeds})"]
            if any(cell != "-" for cell in row):
                lines.append(f"| {arm} | {' | '.join(row)} |")
        pairs = [(first, second) for first, second in itertools.combinations(arms, 2)] + [(arm, BASE) for arm in arms]
        lines += ["", *_header("difference", later)]
        for first, second in pairs:
            row = []
            for step in later:
                other = cells.get((second, 0 if second == BASE else step))
                mine = cells.get((first, step))
                if mine is None or other is None:
                    row += ["-", "-"]
                    continue
                noise = evaluation_variance(found[(BASE, view, 0)], metric) if second == BASE else None
                seed_value = seed_level(mine, other, seeds, noise)
                row += [_seed_fmt(seed_value, signed=True), _fmt(difference(mine, other, draws), signed=True)]
            if any(cell != "-" for cell in row):
                lines.append(f"| {first} - {second} | {' | '.join(row)} |")
        base_tasks = {key: value for key, value in by_tasks.items() if key[0] == BASE}
        plots.append(_plot(by_seeds, base_tasks, arms, out / f"{view}_{metric}.png", view, metric))
    runs_by_arm: dict[str, list[Path]] = {arm: [] for arm in arms}
    for run_dir in map(Path, run_dirs):
        runs_by_arm.setdefault(arm_of(run_dir)[1], []).append(run_dir)
    learned = library_report(runs_by_arm)
    if learned:
        lines += ["", "## What the library learned", "", learned]
    return "\n".join(lines), plots


def _plot(
    by_seeds: dict[tuple[str, int], SeedInterval],
    base: dict[tuple[str, int], Estimate],
    arms: list[str],
    path: Path,
    view: str,
    metric: str,
) -> Path:
    """Each arm's mean over its evaluation steps, from the base model at step 0, its t interval over
    seeds shaded (none at the base model, which has no training seed, nor at an arm's single seed)."""
    start = base.get((BASE, 0))
    lines, bands = {}, {}
    for arm in arms:
        points = sorted(
            (step, value.mean, value.low, value.high) for (name, step), value in by_seeds.items() if name == arm
        )
        if start is not None:
            points = [(0, start.mean, None, None), *points]
        lines[arm] = ([step for step, *_ in points], [mean for _, mean, _, _ in points])
        bands[arm] = (
            [mean if low is None else low for _, mean, low, _ in points],
            [mean if high is None else high for _, mean, _, high in points],
        )
    title = f"held-out {metric.replace('_', ' ')}, {view.replace('_', ' ')} (mean, {LEVEL:.0%} t interval over seeds)"
    draw_lines(lines, path, title, metric.replace("_", " "), unit_interval=METRICS[metric][2], bands=bands)
    return path
