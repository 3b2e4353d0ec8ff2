"""EDGE distillation: the gain gate, the log-ratio signal and its gradient, against hand-computed values."""

import numpy as np
import pytest
import torch

from learner.edge import (
    EpisodeOutcome,
    distill_advantages,
    distill_log_ratio,
    distilled,
    edge_metrics,
    episode_outcomes,
    group_gain,
    select_teachers,
)
from learner.loss import gather_logprobs, ppo_loss
from slea.config import SleaConfig
from slea.records import StepRecord


def step(
    episode: str,
    index: int,
    *,
    with_experience: bool,
    done: bool = False,
    success: bool = False,
    reward: float = 0.0,
    teacher: list[int] = (),
    group: str = "g",
) -> StepRecord:
    return StepRecord(
        "r",
        "t",
        "k",
        "e",
        group,
        episode,
        index,
        "o",
        reward=reward,
        done=done,
        success=success,
        with_experience=with_experience,
        teacher_prompt_ids=np.asarray(teacher, dtype=np.int32),
        response_ids=np.array([1], np.int32),
        response_logprobs=np.array([-1.0], np.float32),
    )


def ab_group(group: str, a_wins: list[bool], b_wins: list[bool]) -> list[StepRecord]:
    """Two-step episodes; A episodes first, B episodes carry teacher prompt [9, index]."""
    records = []
    for half, wins in (("a", a_wins), ("b", b_wins)):
        for index, won in enumerate(wins):
            episode = f"{group}-{half}{index}"
            teacher = [] if half == "a" else [9, index]
            records.append(step(episode, 0, with_experience=half == "a", teacher=teacher, group=group))
            records.append(
                step(
                    episode,
                    1,
                    with_experience=half == "a",
                    done=True,
                    success=won,
                    reward=float(won),
                    teacher=teacher,
                    group=group,
                )
            )
    return records


# -- the gate ----------------------------------------------------------------------------------------


def test_episode_outcomes_sum_rewards_and_read_the_done_step():
    records = [
        step("e1", 1, with_experience=False, done=True, success=True, reward=2.0),
        step("e1", 0, with_experience=False, reward=-0.5),
        step("e0", 0, with_experience=True, done=True, reward=0.25),
    ]
    outcomes = sorted(episode_outcomes(records), key=lambda o: o.with_experience)
    assert outcomes == [EpisodeOutcome(False, True, 1.5), EpisodeOutcome(True, False, 0.25)]


def test_gain_is_a_half_minus_b_half():
    # A: 2 of 3 won (0.667), B: 1 of 4 won (0.25) -> gain 5/12; returns A mean 1.0, B mean 3.0 -> -2.
    outcomes = (
        [EpisodeOutcome(True, True, 1.0), EpisodeOutcome(True, True, 2.0), EpisodeOutcome(True, False, 0.0)]
        + [EpisodeOutcome(False, True, 12.0)]
        + [EpisodeOutcome(False, False, 0.0)] * 3
    )
    assert group_gain(outcomes, "success") == pytest.approx(2 / 3 - 1 / 4)
    assert group_gain(outcomes, "return") == pytest.approx(1.0 - 3.0)
    assert group_gain([EpisodeOutcome(True, True, 1.0)]) is None  # no B half: not an A/B group


@pytest.mark.parametrize(
    "gain, threshold, expected",
    [
        (0.5, 0.0, True),
        (0.0, 0.0, False),
        (-0.25, 0.0, False),
        (0.25, 0.25, False),
        (0.3, 0.25, True),
        (-0.1, -0.2, True),
        (None, -1.0, False),
    ],
)
def test_gate_needs_gain_strictly_above_threshold(gain, threshold, expected):
    assert distilled(gain, threshold) is expected


def test_teachers_only_for_b_steps_of_gated_in_groups():
    helped = ab_group("g1", a_wins=[True, True], b_wins=[False, True])  # gain 1 - 0.5 = 0.5
    hurt = ab_group("g2", a_wins=[False, False], b_wins=[True, False])  # gain 0 - 0.5 = -0.5
    selection = select_teachers([helped, hurt], threshold=0.0)
    teachers = [t.tolist() for t in selection.teacher_prompts]
    assert len(teachers) == len(helped) + len(hurt)
    assert teachers[:8] == [[], [], [], [], [9, 0], [9, 0], [9, 1], [9, 1]]  # A steps never, B steps of g1 yes
    assert teachers[8:] == [[]] * 8  # g2 gated out
    assert selection.gains == [0.5, -0.5] and selection.groups_gated_in == 1
    metrics = edge_metrics(selection, groups=2)
    assert metrics == {"edge_gated_fraction": 0.5, "edge_gain_mean": 0.0, "edge_distilled_steps": 4}
    assert select_teachers([helped], threshold=0.5).groups_gated_in == 0


# -- the signal and its gradient -----------------------------------------------------------------------


def test_log_ratio_and_advantages_by_hand():
    student = torch.tensor([[-1.0, -3.0, -0.5]])
    teacher = torch.tensor([[-2.0, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # third token not distilled
    log_ratio = distill_log_ratio(student, teacher, mask)
    torch.testing.assert_close(log_ratio, torch.tensor([[1.0, -2.0, 0.0]]))
    # sequence advantage 0.3, coef 0.5: 0.3 - 0.5 * d
    torch.testing.assert_close(
        distill_advantages(torch.tensor([0.3]), log_ratio, 0.5), torch.tensor([[-0.2, 1.3, 0.3]])
    )


def test_distillation_gradient_is_coef_times_log_ratio_per_token():
    # On policy (ratio 1, behaviour = proximal), advantage 0 apart from the distillation, 2 tokens:
    # loss = -sum_t A_t * ratio_t / 2 with A_t = -coef * d_t  ->  dloss/dlogp_t = coef * d_t / 2.
    logprobs = torch.tensor([[-1.0, -3.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[-2.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    advantages = distill_advantages(
        torch.zeros(1, dtype=torch.float64), distill_log_ratio(logprobs, teacher, mask), 0.5
    )
    same = logprobs.detach()
    ppo_loss(logprobs, same, same, advantages, mask, clip_low=10.0, clip_high=10.0).loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.25, -0.5]], dtype=torch.float64))


def test_descending_the_loss_moves_the_students_logprob_toward_the_teachers():
    # A 4-token vocabulary; the student puts the sampled token 2 at log-prob above the teacher's
    # (token 0 sampled too, below the teacher's). A few SGD steps on the distillation term alone
    # close both gaps, from both sides.
    logits = torch.tensor([[[0.0, 0.0, 2.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]], requires_grad=True)
    tokens = torch.tensor([[2, 0]])
    teacher = torch.log(torch.tensor([[0.3, 0.6]]))
    mask = torch.ones(1, 2)
    optimizer = torch.optim.SGD([logits], lr=1.0)
    gaps = []
    for _ in range(20):
        logprobs = gather_logprobs(logits, tokens)
        gaps.append((logprobs - teacher).detach())
        advantages = distill_advantages(torch.zeros(1), distill_log_ratio(logprobs, teacher, mask), 1.0)
        optimizer.zero_grad()
        ppo_loss(logprobs, logprobs.detach(), logprobs.detach(), advantages, mask).loss.backward()
        optimizer.step()
    first, last = gaps[0][0], gaps[-1][0]
    assert first[0] > 0.3 and first[1] < -0.3  # student above the teacher on token 2, below on token 0
    assert last.abs().max() < 0.1 * first.abs().min()


# -- in the trainer (real DeepSpeed on CPU, tiny model) ---------------------------------------------------


@pytest.mark.slow
def test_trainer_reports_the_sampled_reverse_kl_of_the_distilled_rows():
    from learner.batch import TrainSample
    from learner.engine import PolicyTrainer
    from slea.config import LearnerConfig
    from slea.models import tiny_model

    model, tokenizer = tiny_model()
    trainer = PolicyTrainer(
        model, LearnerConfig(lr=1e-3, kl_coef=0.0, entropy_coef=0.0, edge_distill_coef=0.5), tokenizer.pad_token_id
    )
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(0, 1000, n).astype(np.int32)  # noqa: E731
    student, teacher, response, other = ids(6), ids(11), ids(4), ids(3)
    samples = [
        TrainSample(student, response, np.full(4, -7.0, np.float32), 0.0, 0, teacher_prompt_ids=teacher),
        TrainSample(ids(5), other, np.full(3, -7.0, np.float32), 0.0, 0),
    ]  # not distilled
    student_lp, teacher_lp = trainer.logprobs(
        [samples[0], TrainSample(teacher, response, samples[0].behaviour_logprobs, 0.0, 0)]
    )
    stats = trainer.train_step(samples)
    assert stats.edge_token_fraction == pytest.approx(4 / 7)
    assert stats.edge_kl == pytest.approx(float((student_lp - teacher_lp).mean()), abs=1e-4)
    assert stats.edge_kl != 0.0 and stats.grad_norm > 0  # the only signal here is the distillation


def test_learner_distils_only_groups_where_experiences_helped(tmp_path, redis_client, local_ray):
    """Real Redis stream and learner: an A/B group where A won (gated in) and one where B won (gated out)."""
    from learner.learner import Learner
    from slea.models import tiny_model
    from slea.streams import StreamProducer
    from tests.learner.conftest import make_group

    cfg = SleaConfig()
    cfg.run.id, cfg.run.dir = "edge", str(tmp_path)
    cfg.actors.group_size, cfg.actors.ab_groups = 2, True
    cfg.redis.block_ms = 50
    for name, value in dict(
        tasks_per_step=2, lr=1e-2, micro_batch_tokens=64, checkpoint_every=100, edge_distill_coef=0.5
    ).items():
        setattr(cfg.learner, name, value)
    model, tokenizer = tiny_model()
    learner = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    records = []
    for group, rewards in (("helped", [1.0, 0.0]), ("hurt", [0.0, 1.0])):
        for record in make_group(learner.trainer.module, tokenizer, group, rewards=rewards):
            if record.episode_id.endswith("-e1"):  # the B half: no experiences shown, the teacher prompt recorded
                record.with_experience = False
                lesson = f"Lesson: examine things.\nTask: find the key.\n{record.anchor_obs}\nYour action:"
                record.teacher_prompt_ids = np.asarray(tokenizer(lesson)["input_ids"], dtype=np.int32)
            records.append(record)
    StreamProducer(redis_client, cfg.stream_key()).send(records)

    result = None
    for _ in range(40):
        learner.poll(block_ms=50)
        result = learner.step()
        if result is not None:
            break
    assert result is not None, "no learner step happened"
    metrics = result.metrics
    assert metrics["edge_gated_fraction"] == 0.5 and metrics["edge_gain_mean"] == 0.0  # gains +1 and -1
    assert metrics["edge_distilled_steps"] == 2  # the two B steps of "helped"
    b_tokens = sum(len(r.response_ids) for r in records if r.group_id == "helped" and not r.with_experience)
    assert metrics["edge_token_fraction"] == pytest.approx(b_tokens / sum(len(r.response_ids) for r in records))
    assert metrics["edge_kl"] != 0.0
    learner.close()
