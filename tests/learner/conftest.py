"""Fixtures shared by the learner tests: a local Ray per test module, tiny-model records."""

import numpy as np
import pytest
import ray
import torch

from learner.loss import gather_logprobs
from slea.channels import RAY_NAMESPACE
from slea.records import StepRecord


@pytest.fixture(scope="module")
def local_ray():
    """A real local Ray (1 CPU): the weight registry is a Ray actor. Per module, so that the
    other packages' tests can start Ray with their own settings."""
    ray.init(num_cpus=1, include_dashboard=False, namespace=RAY_NAMESPACE, log_to_driver=False)
    yield
    ray.shutdown()


def behaviour_logprobs(model, prompt_ids: np.ndarray, response_ids: np.ndarray) -> np.ndarray:
    """Log-probs of `response_ids` under `model`, as the actor that sampled them would report."""
    ids = torch.from_numpy(np.concatenate([prompt_ids, response_ids]).astype(np.int64))[None]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return gather_logprobs(logits, ids[0, len(prompt_ids) :]).numpy().astype(np.float32)


# Actions sharing no token, so a test can tell which one training pushed up.
ACTIONS = ["examine red key", "go north quickly", "open drawer 1"]


def make_group(
    model, tokenizer, group_id: str, rewards: list[float], steps: int = 2, version: int = 0
) -> list[StepRecord]:
    """A task group: one episode per reward; episode i answers every step with ACTIONS[i] and
    gets `rewards[i]` on its last step; all episodes start from the same observation (an anchor)."""
    records = []
    for index, reward in enumerate(rewards):
        action = ACTIONS[index]
        for step in range(steps):
            observation = (
                "You are in the middle of a room." if step == 0 else f"You arrive at shelf {index + 1}. ({step})"
            )
            prompt = np.asarray(
                tokenizer(f"Task: find the key.\n{observation}\nYour action:")["input_ids"], dtype=np.int32
            )
            response = np.asarray(tokenizer(action)["input_ids"], dtype=np.int32)
            last = step == steps - 1
            records.append(
                StepRecord(
                    run_id="test",
                    task_id=group_id,
                    task_type="find",
                    env_name="toy",
                    group_id=group_id,
                    episode_id=f"{group_id}-e{index}",
                    step=step,
                    anchor_obs=observation,
                    prompt_ids=prompt,
                    response_ids=response,
                    response_logprobs=behaviour_logprobs(model, prompt, response),
                    action=action,
                    reward=reward if last else 0.0,
                    done=last,
                    success=last and reward > 0,
                    policy_version=version,
                )
            )
    return records
