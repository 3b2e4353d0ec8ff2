"""The actors' weight subscriber on a real local Ray, fed by the learner's real publisher: weights
whose names do not match the engine's model are refused loudly, once, and nothing is loaded."""

import asyncio
import logging

import pytest
import torch

from actors.engines.base import SamplingSettings
from actors.engines.transformers_engine import TransformersEngine
from actors.weights_client import WeightSubscriber
from learner.weights import RayWeightPublisher
from slea.models import tiny_model

pytestmark = pytest.mark.slow


def test_a_renamed_key_is_refused_once_and_the_next_good_version_loads(ray_cluster, caplog):
    model, tokenizer = tiny_model(seed=3)
    engine = TransformersEngine(model, tokenizer, SamplingSettings(max_new_tokens=2))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    publisher = RayWeightPublisher("weights-client-test")
    subscriber = WeightSubscriber("weights-client-test")
    renamed = tiny_model(seed=11)[0].state_dict()
    renamed["model.norm.scale"] = renamed.pop("model.norm.weight")
    publisher.publish(1, renamed)
    publisher.flush()

    with caplog.at_level(logging.ERROR, logger="actors.weights_client"):
        assert asyncio.run(subscriber.poll(engine)) is False
        assert asyncio.run(subscriber.poll(engine)) is False  # the same version: not fetched or logged again
    lines = [record.getMessage() for record in caplog.records if record.name == "actors.weights_client"]
    assert len(lines) == 1 and "weights of version 1 refused, still generating with version 0" in lines[0]
    assert "missing ['model.norm.weight'], unexpected ['model.norm.scale']" in lines[0]
    engine.generate_batch([[1, 2, 3]])
    assert engine.policy_version == 0 and subscriber.current_version(engine) == 0
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())

    good = tiny_model(seed=11)[0].state_dict()
    publisher.publish(2, good)
    publisher.flush()
    assert asyncio.run(subscriber.poll(engine)) is True
    engine.generate_batch([[1, 2, 3]])
    assert engine.policy_version == 2
    assert all(torch.equal(tensor, good[name]) for name, tensor in model.state_dict().items())
