"""Weight registry on a real local Ray: versions go up, actors fetch the latest by name."""

import pytest
import ray
import torch

from learner.weights import RayWeightPublisher, VersionRecord, VersionStart, resume_version
from slea.channels import RAY_NAMESPACE, policy_version_key, weight_registry_name


def test_publish_and_fetch_latest(local_ray):
    publisher = RayWeightPublisher("weights-test")
    assert publisher.latest_version() == -1
    publisher.publish(1, {"w": torch.ones(3)})
    publisher.publish(2, {"w": torch.full((3,), 2.0)})
    publisher.flush()
    registry = ray.get_actor(weight_registry_name("weights-test"), namespace=RAY_NAMESPACE)  # as an actor finds it
    version, ref = ray.get(registry.get_latest.remote(1))
    assert version == 2
    torch.testing.assert_close(ray.get(ref)["w"], torch.full((3,), 2.0))
    assert ray.get(registry.get_latest.remote(3)) is None  # nothing newer than what the caller holds


def test_versions_never_repeat_and_survive_a_new_publisher(local_ray):
    first = RayWeightPublisher("weights-restart")
    first.publish(5, {"w": torch.zeros(1)})
    first.flush()
    del first  # the learner goes away; the detached registry owns the weights
    second = RayWeightPublisher("weights-restart")
    assert second.latest_version() == 5
    second.publish(5, {"w": torch.zeros(1)})
    with pytest.raises(ray.exceptions.RayTaskError, match="not newer"):
        second.flush()


@pytest.mark.parametrize(
    "checkpoint, registry, recorded, expected",
    [
        (0, -1, -1, VersionStart(0, publish=True)),  # the first start: the initial weights are version 0
        (2, 3, 3, VersionStart(3, publish=False)),  # learner restarted, registry alive: continue after 3
        (2, 3, -1, VersionStart(3, publish=False)),  # the same, for a run from before the Redis record
        (3, -1, 3, VersionStart(3, publish=True)),  # resumed after a stop: the checkpoint is version 3
        (3, -1, -1, VersionStart(3, publish=True)),  # ... and without a record
        (2, -1, 3, VersionStart(4, publish=True)),  # cluster lost after 3 was published: 3 is taken
        (2, 2, 3, VersionStart(4, publish=True)),  # 3 recorded, the registry never got it: still taken
        (5, 3, 4, VersionStart(5, publish=True)),  # a checkpoint newer than the registry (its last publish lost)
    ],
)
def test_resume_version_never_reuses_a_number_and_skips_none(checkpoint, registry, recorded, expected):
    assert resume_version(checkpoint, registry, recorded) == expected


def test_every_publish_is_recorded_in_redis_before_the_registry_announces_it(local_ray, redis_client):
    record = VersionRecord(redis_client, "weights-record")
    assert record.latest() == -1
    publisher = RayWeightPublisher("weights-record", record=record)
    publisher.publish(1, {"w": torch.ones(1)})
    assert redis_client.get(policy_version_key("weights-record")) == b"1"  # at once, not after the registry
    publisher.publish(2, {"w": torch.ones(1)})
    publisher.flush()
    assert record.latest() == publisher.latest_version() == 2


def test_a_tied_table_is_copied_and_sent_once():
    """Copied name by name, lm_head.weight and embed_tokens.weight became two tensors, and every
    transport sent the table twice; the copy keeps them one tensor, which each transport sends once."""
    import pickle

    from learner.state_copy import cpu_copy
    from slea.weight_group import plan_buckets

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(1000, 64)
            self.norm = torch.nn.LayerNorm(64)
            self.lm_head = torch.nn.Linear(64, 1000, bias=False)
            self.lm_head.weight = self.embed_tokens.weight

    model = Tied()
    copied = cpu_copy(model.state_dict())
    assert list(copied) == list(model.state_dict())  # every name, for the receivers' name check
    assert copied["lm_head.weight"] is copied["embed_tokens.weight"]
    assert copied["norm.weight"].data_ptr() != model.norm.weight.data_ptr()  # a copy, not a view
    table_bytes = 1000 * 64 * 4
    assert sum(len(bucket["tensors"]) for bucket in plan_buckets(copied)) == 3  # table, norm weight and bias
    assert len(pickle.dumps(copied)) < 1.2 * table_bytes  # the object store's serialisation: once
    separate = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}
    assert len(pickle.dumps(separate)) > 1.9 * table_bytes  # what the name-by-name copy cost


def test_the_object_store_keeps_a_tied_table_one_tensor(local_ray):
    from learner.state_copy import cpu_copy

    table = torch.nn.Parameter(torch.randn(100, 8))
    fetched = ray.get(ray.put(cpu_copy({"embed_tokens.weight": table, "lm_head.weight": table})))
    assert fetched["lm_head.weight"].data_ptr() == fetched["embed_tokens.weight"].data_ptr()


def test_recording_a_version_keeps_the_runs_expiry(redis_client):
    """The driver refreshes the expiry of the run's keys (driver/retention.py): the learner's SET of a
    new version between two refreshes must not take it off, or a SIGKILLed driver leaves the key for ever."""
    record = VersionRecord(redis_client, "weights-ttl")
    record.record(1)
    redis_client.expire(policy_version_key("weights-ttl"), 3600)
    record.record(2)
    assert record.latest() == 2 and 0 < redis_client.ttl(policy_version_key("weights-ttl")) <= 3600
