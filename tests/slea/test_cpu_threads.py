"""Ray actors size torch's thread pool to the CPUs Ray assigned them, and their waiting OpenMP threads sleep."""

import os

import pytest
import ray
import torch

from slea.cpu_threads import WAIT_POLICY, use_assigned_cpus, worker_environment

pytestmark = pytest.mark.slow  # a local Ray


@ray.remote
class ThreadProbe:
    def __init__(self, phases_alternate: bool = False):
        self.threads = use_assigned_cpus(phases_alternate)

    def threads_in_use(self) -> tuple[int, int]:
        return self.threads, torch.get_num_threads()

    def wait_policy(self) -> str | None:
        return os.environ.get(WAIT_POLICY)


@pytest.fixture(scope="module")
def two_cpu_ray():
    # As slea train, serve-library and the evaluation's own library start Ray.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": worker_environment()})
    yield
    ray.shutdown()


@pytest.mark.parametrize("num_cpus, expected", [(1, 1), (2, 2), (0.5, 1)])
def test_an_actor_computes_on_its_assigned_cpus(two_cpu_ray, num_cpus, expected):
    probe = ThreadProbe.options(num_cpus=num_cpus).remote()
    assert ray.get(probe.threads_in_use.remote()) == (expected, expected)
    ray.kill(probe)


def test_the_synchronous_baseline_gives_each_phase_every_core(two_cpu_ray):
    probe = ThreadProbe.options(num_cpus=1).remote(phases_alternate=True)
    cores = len(os.sched_getaffinity(0))
    assert ray.get(probe.threads_in_use.remote()) == (cores, cores)
    ray.kill(probe)


def test_every_worker_starts_with_a_passive_openmp_wait_policy(two_cpu_ray):
    """Set before the worker imported torch (libgomp reads it once, when it loads), so it takes effect."""
    probe = ThreadProbe.options(num_cpus=1).remote()
    assert ray.get(probe.wait_policy.remote()) == "PASSIVE"
    ray.kill(probe)


def test_a_wait_policy_the_user_set_wins(monkeypatch):
    monkeypatch.setenv(WAIT_POLICY, "ACTIVE")
    assert worker_environment() == {WAIT_POLICY: "ACTIVE"}
    monkeypatch.delenv(WAIT_POLICY)
    assert worker_environment() == {WAIT_POLICY: "PASSIVE"}
