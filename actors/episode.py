"""One episode, step by step: retrieve for the current observation, prompt, generate, act, record.

This is SLEA-RL's actor loop in one function. Everything it needs arrives as arguments, so the
actor worker, `slea eval` and the tests all play episodes through the same code.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from actors.engines.base import GenerationEngine
from actors.envs.actions import parse_action
from actors.envs.base import EnvTask, TextEnv
from actors.prompts import Experience, PromptBuilder, TurnHistory
from actors.retrieval_client import RetrievalClient, Retrieved
from slea.records import StepRecord


@dataclass
class EpisodeSpec:
    """Which trajectory of which group to play, and how."""

    run_id: str  # stream the steps go to
    task: EnvTask  # the group's task
    group_id: str  # shared by the G trajectories of the task
    episode_id: str  # unique per trajectory
    step_budget: int  # steps before the episode is cut off
    with_experience: bool  # retrieve and inject experiences (False: B half of A/B groups, or grpo)
    retrieval_mode: str  # "step": every step; "task": once at step 0
    teacher_prompt: bool = False  # EDGE distillation (B half): retrieve, do not show, record the prompt with them
    hidden_retrieval: bool = False  # B half of A/B groups: retrieve, show nothing, record only the anchor cluster


@dataclass
class StepTimers:
    """Where an actor's wall time goes (seconds, summed over steps), and what its steps showed."""

    generation_s: float = 0.0  # awaiting the engine (episodes overlap: can exceed wall time)
    prefill_s: float = 0.0  # of generation_s: the engine reading the prompt (batched: its batch's, per episode)
    decode_s: float = 0.0  # of generation_s: the engine writing the response; the rest queued for a batch slot
    env_s: float = 0.0  # inside env.reset / env.step
    retrieval_wait_s: float = 0.0  # awaiting the library (episodes overlap: can exceed wall time)
    overhead_s: float = 0.0  # ours, run serially in the event loop: prompt building, records, XADD
    steps: int = 0
    tokens: int = 0  # response tokens generated
    prompt_tokens: int = 0  # prompt tokens generated from
    cached_prompt_tokens: int = 0  # of prompt_tokens: held by the engine's prefix cache (vLLM), not prefilled again
    strategy_steps: int = 0  # steps whose prompt showed at least one strategy (E+)
    warning_steps: int = 0  # steps whose prompt showed at least one warning (E-)


@dataclass
class EpisodeResult:
    """Summary of a played episode (the steps themselves went to `emit`)."""

    spec: EpisodeSpec
    steps: int  # steps played
    success: bool  # won within the budget
    total_reward: float  # sum of step rewards
    invalid_steps: int  # unparsable or inadmissible actions
    records: list[StepRecord] = field(default_factory=list)  # kept only when keep_records=True (eval, tests)


async def play_episode(
    spec: EpisodeSpec,
    env: TextEnv,
    engine: GenerationEngine,
    builder: PromptBuilder,
    retrieval: RetrievalClient | None,
    emit: Callable[[StepRecord], Awaitable[None] | None],
    timers: StepTimers | None = None,
    keep_records: bool = False,
) -> EpisodeResult:
    """Play `spec` to done or to its step budget; each step is handed to `emit` as it happens."""
    timers = timers or StepTimers()
    started = time.perf_counter()
    reset = env.reset(spec.task)
    timers.env_s += time.perf_counter() - started
    history = TurnHistory(reset.task_text)
    observation = reset.observation
    result = EpisodeResult(spec, steps=0, success=False, total_reward=0.0, invalid_steps=0)
    retrieved = Retrieved()
    for step in range(spec.step_budget):
        retrieved_now = False
        asks = spec.with_experience or spec.hidden_retrieval or spec.teacher_prompt
        if retrieval is not None and asks and (spec.retrieval_mode == "step" or step == 0):
            retrieve_started = time.perf_counter()
            retrieved = await retrieval.retrieve(observation.anchor_obs, spec.task.task_type, spec.retrieval_mode)
            timers.retrieval_wait_s += time.perf_counter() - retrieve_started
            retrieved_now = True
        tick = time.perf_counter()
        shown = retrieved if spec.with_experience else Retrieved()  # the B half retrieves for its cluster and teacher
        prompt_ids, injected = builder.build(
            history, observation.text, observation.admissible_actions, shown.experiences
        )
        teacher_ids = []
        if spec.teacher_prompt and retrieved.experiences:
            teacher_ids, _ = builder.build(
                history, observation.text, observation.admissible_actions, retrieved.experiences
            )
        generate_started = time.perf_counter()
        timers.overhead_s += generate_started - tick
        generation = await engine.generate(prompt_ids)
        env_started = time.perf_counter()
        timers.generation_s += env_started - generate_started
        action = parse_action(builder.response_prefix + generation.text)
        outcome = env.step(action)
        after_env = time.perf_counter()
        timers.env_s += after_env - env_started
        done = outcome.done or step == spec.step_budget - 1
        record = _step_record(spec, step, observation.anchor_obs, generation, action, outcome, done, shown, injected)
        record.teacher_prompt_ids = np.asarray(teacher_ids, dtype=np.int32)
        # Both halves of an A/B group record the cluster, so with `learner.anchor: cluster` a state
        # falls in one anchor group whichever half reached it. In "task" mode later steps keep
        # step 0's experiences, not its cluster.
        if retrieved_now:
            record.anchor_cluster = retrieved.cluster_id
        emitted = emit(record)
        if inspect.isawaitable(emitted):  # the actor worker's: waits while its outbox is full (backpressure)
            await emitted
        if keep_records:
            result.records.append(record)
        history.record(observation.text, action or "")
        observation = outcome.observation
        result.steps += 1
        result.total_reward += outcome.reward
        result.invalid_steps += not outcome.action_valid
        result.success = result.success or (outcome.won and outcome.done)
        timers.steps += 1
        timers.tokens += len(generation.response_ids)
        timers.prompt_tokens += len(generation.prompt_ids)
        timers.cached_prompt_tokens += generation.cached_prompt_tokens
        timers.prefill_s += generation.prefill_s
        timers.decode_s += generation.decode_s
        timers.strategy_steps += any(experience.zone == "strategy" for experience in injected)
        timers.warning_steps += any(experience.zone == "warning" for experience in injected)
        timers.overhead_s += time.perf_counter() - after_env
        if done:
            break
    return result


def _step_record(
    spec: EpisodeSpec,
    step: int,
    anchor_obs: str,
    generation,
    action: str | None,
    outcome,
    done: bool,
    retrieved: Retrieved,
    injected: list[Experience],
) -> StepRecord:
    return StepRecord(
        run_id=spec.run_id,
        task_id=spec.task.task_id,
        task_type=spec.task.task_type,
        env_name=spec.task.env_name,
        group_id=spec.group_id,
        episode_id=spec.episode_id,
        step=step,
        anchor_obs=anchor_obs,
        prompt_ids=np.asarray(generation.prompt_ids, dtype=np.int32),
        response_ids=generation.response_ids,
        response_logprobs=generation.logprobs,
        action=action or "",
        action_valid=outcome.action_valid,
        reward=float(outcome.reward),
        done=done,
        success=bool(outcome.won and outcome.done),
        policy_version=generation.policy_version,
        library_version=retrieved.library_version,
        experience_ids=[e.experience_id for e in injected],
        step_budget=spec.step_budget,
        with_experience=spec.with_experience,
    )
