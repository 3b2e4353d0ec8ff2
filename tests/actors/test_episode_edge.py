"""play_episode and the worker's task groups under A/B groups and EDGE distillation: the B half
retrieves (for its anchor cluster and its teacher) but never shows what it got; one step budget
per group."""

import asyncio

from helpers import FixedEngine

from actors.envs.registry import make_env
from actors.episode import EpisodeSpec, StepTimers, play_episode
from actors.prompts import Experience, PromptBuilder
from actors.retrieval_client import Retrieved
from slea.models import shipped_tokenizer

TOKENIZER = shipped_tokenizer()
LESSON = Experience("s1", "strategy", "Walk around the holes, never through them.")


class OneLessonLibrary:
    def __init__(self):
        self.calls = 0

    async def retrieve(self, observation, task_type, mode="step"):
        self.calls += 1
        return Retrieved([LESSON], library_version=7, hit=True, cluster_id="c1")


def play(with_experience: bool, teacher_prompt: bool):
    env = make_env("frozenlake", max_steps=3)
    task = env.make_task(0, split="train")
    spec = EpisodeSpec("run", task, "g", f"g-{int(with_experience)}", 3, with_experience, "step", teacher_prompt)
    engine, library = FixedEngine(), OneLessonLibrary()
    builder = PromptBuilder(TOKENIZER)
    result = asyncio.run(play_episode(spec, env, engine, builder, library, lambda _r: None, keep_records=True))
    return result.records, engine, library


def test_b_half_records_the_teacher_prompt_and_generates_without_it():
    records, engine, library = play(with_experience=False, teacher_prompt=True)
    assert library.calls == len(records) > 0
    for record, prompt in zip(records, engine.prompts):
        shown, teacher = TOKENIZER.decode(record.prompt_ids), TOKENIZER.decode(record.teacher_prompt_ids)
        assert record.prompt_ids.tolist() == prompt and LESSON.text not in shown  # generated without the lesson
        assert LESSON.text in teacher and teacher != shown
        # otherwise a B step: nothing injected, but the cluster of its state, as an A step records it
        assert not record.with_experience and record.experience_ids == [] and record.library_version == -1
        assert record.anchor_cluster == "c1"


def test_a_half_and_plain_b_half_have_no_teacher_prompt():
    a_records, _, _ = play(with_experience=True, teacher_prompt=False)
    assert all(len(r.teacher_prompt_ids) == 0 and r.experience_ids == ["s1"] for r in a_records)
    b_records, _, library = play(with_experience=False, teacher_prompt=False)
    assert library.calls == 0 and all(len(r.teacher_prompt_ids) == 0 for r in b_records)


def test_worker_asks_the_b_half_for_a_teacher_prompt_only_when_distilling(redis_client):
    from actors.worker import ActorWorker
    from slea.config import SleaConfig

    config = SleaConfig()
    config.envs.name, config.envs.panel_size = "frozenlake", 2
    config.actors.group_size, config.actors.ab_groups = 4, True
    halves = {}
    for coef in (0.0, 0.1):
        config.learner.edge_distill_coef = coef
        worker = ActorWorker(config, 0, redis_client, FixedEngine(), retrieval=OneLessonLibrary())
        specs = worker._group_specs(next(worker._tasks))
        halves[coef] = [(spec.with_experience, spec.hidden_retrieval, spec.teacher_prompt) for spec in specs]
    # (shown, hidden retrieval, teacher prompt): the B half always retrieves for its anchor cluster
    assert halves[0.0] == [(True, False, False), (True, False, False), (False, True, False), (False, True, False)]
    assert halves[0.1] == [(True, False, False), (True, False, False), (False, True, True), (False, True, True)]


def test_budget_mixed_training_draws_one_budget_per_group(redis_client):
    from actors.worker import ActorWorker
    from slea.config import SleaConfig

    config = SleaConfig()
    config.run.seed = 11
    config.envs.name, config.envs.panel_size, config.envs.budgets = "frozenlake", 2, [3, 5, 8]
    config.actors.group_size = 4
    worker = ActorWorker(config, 0, redis_client, FixedEngine())
    group_budgets = [{spec.step_budget for spec in worker._group_specs(next(worker._tasks))} for _ in range(30)]
    assert all(len(budgets) == 1 for budgets in group_budgets)  # every trajectory of a group has the same horizon
    assert set().union(*group_budgets) == {3, 5, 8}  # and the groups still mix the budgets


def test_steps_count_what_their_prompts_showed():
    """The worker's summary counts steps whose prompt showed a strategy or a warning (the driver's
    "prompts with experiences"): the A half shows the lesson at every step, the B half never."""
    env = make_env("frozenlake", max_steps=3)
    task = env.make_task(0, split="train")
    for with_experience, expected in ((True, 1), (False, 0)):
        timers = StepTimers()
        spec = EpisodeSpec("run", task, "g", f"g-{int(with_experience)}", 3, with_experience, "step")
        result = asyncio.run(
            play_episode(
                spec, env, FixedEngine(), PromptBuilder(TOKENIZER), OneLessonLibrary(), lambda _r: None, timers
            )
        )
        assert timers.steps == result.steps > 0
        assert (timers.strategy_steps, timers.warning_steps) == (expected * result.steps, 0)
