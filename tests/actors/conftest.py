"""Fixtures of the actor tests that start Ray."""

import pytest
import ray

from slea.channels import RAY_NAMESPACE


@pytest.fixture(scope="module")
def ray_cluster():
    """A real local Ray (2 CPUs) per test module, so other modules can start Ray with their own settings."""
    ray.init(num_cpus=2, include_dashboard=False, namespace=RAY_NAMESPACE, log_to_driver=False)
    yield
    ray.shutdown()
