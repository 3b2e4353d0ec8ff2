"""Weight registry on a real local Ray: versions go up, actors fetch the latest by name."""

import pytest
import ray
import torch

from learner.weights import RayWeightPublisher
from slea.channels import RAY_NAMESPACE, weight_registry_name


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
