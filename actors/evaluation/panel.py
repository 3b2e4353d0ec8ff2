"""Play a fixed evaluation panel through one engine and summarise it.

Every task of the panel is played n times sampled and once greedy, with and without the
library. All episodes of a decoding phase run concurrently (one asyncio.gather of
`play_episode`), so the engine batches their generations exactly as an actor worker's do;
the two phases run one after the other because the engine's sampling settings are read at
every generation and must not change while an episode is in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from actors.engines.base import GenerationEngine
from actors.envs.base import EnvTask, TextEnv
from actors.episode import EpisodeSpec, StepTimers, play_episode
from actors.evaluation.pass_at_k import pass_at_k_t_grid
from actors.prompts import PromptBuilder
from actors.retrieval_client import RetrievalClient
from slea.records import StepRecord

DECODINGS = ("sampled", "greedy")


@dataclass
class EpisodeOutcome:
    """One evaluation episode, reduced to what the report needs."""

    task_id: str  # panel task id
    task_type: str  # the task's type (success is reported per type)
    decoding: str  # "sampled" (config temperature) or "greedy" (temperature 0)
    library: bool  # experiences were retrieved and injected into its prompts
    sample: int  # 0..n-1 for sampled episodes, 0 for the greedy one
    steps: int  # steps played (the winning step when it succeeded)
    success: bool  # won within the step budget
    invalid_steps: int  # unparsable or inadmissible actions
    injected_steps: int  # steps whose prompt carried at least one experience
    total_reward: float  # the episode's summed step rewards (TextWorld's partial scores)


@dataclass
class ModeSummary:
    """One row of the report: a decoding x library combination."""

    decoding: str  # "sampled" or "greedy"
    library: bool  # with experiences retrieved from the library
    available: bool  # False: the library was unreachable, so nothing was played for this row
    note: str  # why the row is unavailable, or what to know about it ("" when nothing)
    episodes: int = 0  # episodes played
    success_rate: float | None = None  # fraction of episodes won
    success_by_task_type: dict[str, float] = field(default_factory=dict)  # task type -> fraction won
    mean_steps: float | None = None  # steps per episode, all episodes
    mean_steps_success: float | None = None  # steps per won episode (None when none won)
    invalid_action_rate: float | None = None  # invalid actions / steps
    injected_step_fraction: float | None = None  # steps with experiences in the prompt / steps
    pass_grid: list[list[float]] | None = None  # [len(ks)][len(budgets)] Pass@(k,T), sampled rows only


@dataclass
class PanelSettings:
    """How the panel is played."""

    samples_per_task: int  # n: sampled episodes per task and library mode (Pass@k needs n >= k)
    step_budget: int  # steps per episode; the largest T of the grid
    temperature: float  # sampled phase temperature (the greedy phase uses 0)
    ks: list[int]  # k values of the Pass@(k,T) grid, each <= samples_per_task
    budgets: list[int]  # T values of the grid, each <= step_budget
    retrieval_mode: str = "step"  # "step": retrieve every step; "task": once at step 0
    max_concurrent: int = 64  # episodes in flight at once (each holds one env)
    greedy: bool = True  # also play one greedy episode per task (False: the greedy rows are not played)
    policy_alone: bool = True  # with a library, also play without it (False: only the with-library rows)

    @property
    def decodings(self) -> tuple[str, ...]:
        return DECODINGS if self.greedy else ("sampled",)


@dataclass
class PanelResult:
    """Everything one panel evaluation measured."""

    settings: PanelSettings  # how it was played
    rows: list[ModeSummary]  # one per decoding x library mode
    outcomes: list[EpisodeOutcome]  # every episode played
    task_types: dict[str, int]  # task type -> tasks of the panel
    library_note: str  # the library's state during the run (reachable or why not)
    retrievals: int  # retrieval calls made by with-library episodes
    retrieval_misses: int  # of those, answered without experiences (timeout, error, unavailable)
    wall_s: dict[str, float]  # decoding phase -> seconds
    generated_tokens: dict[str, int]  # decoding phase -> response tokens generated
    policy_version: int  # weights version that played


def default_budgets(step_budget: int) -> list[int]:
    """A quarter, half and all of the budget: enough to see whether success comes early or late."""
    return sorted({max(1, step_budget // 4), max(1, step_budget // 2), step_budget})


def default_ks(samples_per_task: int) -> list[int]:
    """Powers of two up to n, and n itself."""
    ks = [1]
    while ks[-1] * 2 <= samples_per_task:
        ks.append(ks[-1] * 2)
    return sorted(set(ks) | {samples_per_task})


def check_settings(settings: PanelSettings) -> None:
    if settings.samples_per_task < 1:
        raise ValueError(f"episodes per task must be at least 1, got {settings.samples_per_task}")
    too_big_k = [k for k in settings.ks if not 1 <= k <= settings.samples_per_task]
    if too_big_k:
        raise ValueError(
            f"k values {too_big_k} need 1 <= k <= episodes per task ({settings.samples_per_task}); "
            "play more episodes per task or drop them"
        )
    too_big_t = [t for t in settings.budgets if not 1 <= t <= settings.step_budget]
    if too_big_t:
        raise ValueError(f"step budgets T {too_big_t} need 1 <= T <= the episode step budget ({settings.step_budget})")


async def play_panel(
    engine: GenerationEngine,
    make_env: Callable[[], TextEnv],
    tasks: list[EnvTask],
    builder: PromptBuilder,
    retrieval: RetrievalClient | None,
    settings: PanelSettings,
    library_note: str,
    env_pool: list[TextEnv] | None = None,
    on_episode: Callable[[int, int], None] | None = None,
) -> PanelResult:
    """Play `tasks` in every mode; with-library rows are marked unavailable when `retrieval` is None.
    `on_episode(played, in all)` is called as each episode finishes (progress for the caller)."""
    check_settings(settings)
    if not tasks:
        raise ValueError("the evaluation panel is empty")
    library_modes = played_library_modes(settings, retrieval is not None)
    # A caller that evaluates again and again (the in-training evaluator) lends its pool and keeps
    # the envs: an ALFWorld env loads a private copy of the planner library when it first plays,
    # and loading one again after earlier copies were closed crashed that process.
    envs: list[TextEnv] = [] if env_pool is None else env_pool
    slots = asyncio.Semaphore(settings.max_concurrent)
    outcomes: list[EpisodeOutcome] = []
    wall_s, tokens = {}, {}
    misses_before = retrieval.misses if retrieval is not None else 0
    base_sampling = engine.sampling
    in_all = len(library_modes) * len(tasks) * (settings.samples_per_task + settings.greedy)  # + the greedy episode
    played = 0

    async def play(task: EnvTask, decoding: str, library: bool, sample: int, timers: StepTimers) -> EpisodeOutcome:
        spec = EpisodeSpec(
            run_id="eval",
            task=task,
            group_id=f"eval-{task.task_id}",
            episode_id=f"eval-{decoding}-{int(library)}-{sample}-{task.task_id}",
            step_budget=settings.step_budget,
            with_experience=library,
            retrieval_mode=settings.retrieval_mode,
        )
        injected = 0

        def count(record: StepRecord) -> None:
            nonlocal injected
            injected += bool(record.experience_ids)

        async with slots:
            env = envs.pop() if envs else make_env()
            try:
                result = await play_episode(spec, env, engine, builder, retrieval if library else None, count, timers)
            finally:
                envs.append(env)
        nonlocal played
        played += 1
        if on_episode is not None:
            on_episode(played, in_all)
        return EpisodeOutcome(
            task.task_id,
            task.task_type,
            decoding,
            library,
            sample,
            result.steps,
            result.success,
            result.invalid_steps,
            injected,
            result.total_reward,
        )

    try:
        for decoding in settings.decodings:
            temperature = settings.temperature if decoding == "sampled" else 0.0
            engine.sampling = dataclasses.replace(base_sampling, temperature=temperature)
            episodes_per_task = settings.samples_per_task if decoding == "sampled" else 1
            timers = StepTimers()
            started = time.perf_counter()
            outcomes += await asyncio.gather(
                *(
                    play(task, decoding, library, sample, timers)
                    for library in library_modes
                    for task in tasks
                    for sample in range(episodes_per_task)
                )
            )
            wall_s[decoding] = time.perf_counter() - started
            tokens[decoding] = timers.tokens
    finally:
        engine.sampling = base_sampling
        if env_pool is None:
            for env in envs:
                env.close()
    retrievals = _retrieval_calls(outcomes, settings.retrieval_mode)
    misses = (retrieval.misses - misses_before) if retrieval is not None else 0
    task_types = defaultdict(int)
    for task in tasks:
        task_types[task.task_type] += 1
    rows = [
        summarise_mode(outcomes, decoding, library, settings, retrieval is not None, library_note)
        if decoding in settings.decodings and (library or False in library_modes)
        else ModeSummary(decoding, library, available=False, note=_not_played(decoding, settings))
        for library in (False, True)
        for decoding in DECODINGS
    ]
    return PanelResult(
        settings,
        rows,
        outcomes,
        dict(task_types),
        library_note,
        retrievals,
        misses,
        wall_s,
        tokens,
        engine.policy_version,
    )


def _retrieval_calls(outcomes: list[EpisodeOutcome], mode: str) -> int:
    """Retrievals play_episode made: one per step in step mode, one per episode in task mode."""
    with_library = [o for o in outcomes if o.library]
    return sum(o.steps for o in with_library) if mode == "step" else len(with_library)


def played_library_modes(settings: PanelSettings, has_library: bool) -> list[bool]:
    """The library modes a panel plays (False: the policy alone, True: with the library): without a
    library the policy alone, whatever the settings (the base policy before the first update);
    with one the pair, or only the with-library rows when `policy_alone` is off."""
    if not has_library:
        return [False]
    return [False, True] if settings.policy_alone else [True]


def _not_played(decoding: str, settings: PanelSettings) -> str:
    if decoding not in settings.decodings:
        return "not played: greedy decoding is off"
    return "not played: the policy alone is off (eval.policy_alone: false)"


def summarise_mode(
    outcomes: list[EpisodeOutcome],
    decoding: str,
    library: bool,
    settings: PanelSettings,
    library_available: bool,
    library_note: str,
) -> ModeSummary:
    """One report row from the episodes of that decoding and library mode (pure: testable by hand)."""
    if library and not library_available:
        return ModeSummary(decoding, library, available=False, note=f"not played: {library_note}")
    mine = [o for o in outcomes if o.decoding == decoding and o.library == library]
    steps = sum(o.steps for o in mine)
    won = [o for o in mine if o.success]
    by_type: dict[str, list[bool]] = defaultdict(list)
    for outcome in mine:
        by_type[outcome.task_type].append(outcome.success)
    row = ModeSummary(
        decoding,
        library,
        available=True,
        note="",
        episodes=len(mine),
        success_rate=len(won) / len(mine),
        success_by_task_type={task_type: float(np.mean(wins)) for task_type, wins in sorted(by_type.items())},
        mean_steps=steps / len(mine),
        mean_steps_success=float(np.mean([o.steps for o in won])) if won else None,
        invalid_action_rate=sum(o.invalid_steps for o in mine) / max(steps, 1),
        injected_step_fraction=sum(o.injected_steps for o in mine) / max(steps, 1),
    )
    if library and row.injected_step_fraction == 0:
        row.note = "the library answered but injected no experience (empty, still warming up, or every call missed)"
    if decoding == "sampled":
        row.pass_grid = pass_at_k_t_grid(
            _steps_matrix(mine, settings.samples_per_task), settings.ks, settings.budgets
        ).tolist()
    return row


def _steps_matrix(outcomes: list[EpisodeOutcome], samples: int) -> np.ndarray:
    """[tasks, n] winning step per episode, NaN where it failed (tasks in first-seen order)."""
    rows: dict[str, np.ndarray] = {}
    for outcome in outcomes:
        row = rows.setdefault(outcome.task_id, np.full(samples, np.nan))
        row[outcome.sample] = outcome.steps if outcome.success else np.nan
    return np.stack(list(rows.values()))
