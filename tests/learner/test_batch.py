"""Token-budget micro-batches and left-padded collation."""

import numpy as np
import pytest
import torch

from learner.batch import TrainSample, collate, plan_micro_batches, ppo_schedule, response_logits
from learner.loss import gather_logprobs
from slea.models import tiny_model


def test_plan_respects_the_budget_and_keeps_every_sample_once():
    lengths = [10, 3, 50, 7, 7, 60]
    plan = plan_micro_batches(lengths, token_budget=40)
    assert plan == [[1, 3, 4, 0], [2], [5]]  # sorted by length; 50 and 60 alone (longer than the budget)
    assert sorted(i for batch in plan for i in batch) == list(range(6))
    assert all(len(batch) * max(lengths[i] for i in batch) <= 40 or len(batch) == 1 for batch in plan)


@pytest.mark.slow
def test_left_padded_logprobs_match_each_sequence_alone():
    model, _ = tiny_model()
    rng = np.random.default_rng(0)
    samples = [
        TrainSample(
            rng.integers(0, 1000, p).astype(np.int32),
            rng.integers(0, 1000, r).astype(np.int32),
            np.zeros(r, np.float32),
            1.0,
            0,
        )
        for p, r in [(5, 3), (9, 1), (3, 6)]
    ]
    batch = collate(samples, pad_id=2)
    assert batch.tokens == 27 and batch.response_mask.sum() == 10
    with torch.no_grad():
        batched = gather_logprobs(response_logits(model, batch), batch.response_ids)
        for row, sample in enumerate(samples):
            ids = torch.from_numpy(np.concatenate([sample.prompt_ids, sample.response_ids]).astype(np.int64))[None]
            alone = gather_logprobs(
                model(ids).logits[0, len(sample.prompt_ids) - 1 : -1], ids[0, len(sample.prompt_ids) :]
            )
            torch.testing.assert_close(
                batched[row, batched.shape[1] - len(sample.response_ids) :], alone, atol=1e-5, rtol=1e-5
            )


def test_ppo_schedule_deals_rows_into_mini_batches_and_reorders_epochs():
    parts, steps = ppo_schedule(rows=5, mini_batches=2, epochs=3, seed=0)
    assert sorted(len(part) for part in parts) == [2, 3] and sorted(sum(parts, [])) == [0, 1, 2, 3, 4]
    assert steps[:2] == [0, 1] and sorted(steps[2:4]) == [0, 1] and sorted(steps[4:]) == [0, 1] and len(steps) == 6
    assert ppo_schedule(5, 2, 3, seed=0) == (parts, steps)  # seeded: every rank draws the same
    assert ppo_schedule(2, 4, 1, seed=0)[0] in ([[0], [1]], [[1], [0]])  # fewer rows than mini-batches: one row each
    whole, steps = ppo_schedule(6, 1, 1, seed=3)  # one mini-batch: the whole batch in one step
    assert len(whole) == 1 and sorted(whole[0]) == list(range(6)) and steps == [0]
