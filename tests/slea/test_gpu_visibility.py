"""A Ray process that asked for no GPU sees none (slea/gpu_visibility.py): checked by the
environment a real local Ray gives tiny actors on a node that has a GPU (a Ray GPU resource and a
CUDA_VISIBLE_DEVICES the workers inherit: what a GPU node looks like to Ray, no GPU needed), and by
the options each kind of run process is started with (actor worker, evaluator, library writer,
Serve replica, learner)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import ray

from slea.config import SleaConfig
from slea.gpu_visibility import gpu_options


def test_no_gpu_asked_means_the_gpus_are_hidden_and_gpus_asked_are_left_to_ray():
    assert gpu_options(0) == {"num_gpus": 0, "runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}}
    assert gpu_options(0.5) == {"num_gpus": 0.5}
    assert gpu_options(2) == {"num_gpus": 2}


@ray.remote
class Environment:
    def get(self, name: str) -> str | None:
        return os.environ.get(name)


@pytest.mark.slow
def test_a_zero_gpu_actor_on_a_gpu_node_sees_no_cuda_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the node's GPU, inherited by every Ray worker
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}})
    try:
        plain = Environment.options(num_cpus=0.1, num_gpus=0).remote()
        hidden = Environment.options(num_cpus=0.1, **gpu_options(0)).remote()
        sharing = Environment.options(num_cpus=0.1, **gpu_options(0.5)).remote()
        # Ray alone leaves the node's GPU visible to a worker that asked for none: the bug.
        assert ray.get(plain.get.remote("CUDA_VISIBLE_DEVICES")) == "0"
        assert ray.get(hidden.get.remote("CUDA_VISIBLE_DEVICES")) == ""
        assert ray.get(hidden.get.remote("OMP_WAIT_POLICY")) == "PASSIVE", "the job's env_vars must still hold"
        assert ray.get(sharing.get.remote("CUDA_VISIBLE_DEVICES")) == "0", "a GPU share sees the GPU Ray assigned"
    finally:
        ray.shutdown()


class _FakeActorClass:
    """Stands in for a Ray actor class: records the options it was started with."""

    def __init__(self):
        self.options_seen: list[dict] = []

    def options(self, **options):
        self.options_seen.append(options)
        return self

    def remote(self, *args):
        return SimpleNamespace(run=SimpleNamespace(remote=lambda: None))


HIDDEN = {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}


def test_every_run_process_without_a_gpu_is_started_with_the_gpus_hidden(monkeypatch, tmp_path):
    import driver.train as train
    import driver.train_eval
    import learner.process
    import library.process
    import library.service
    from actors.pool import ActorPool
    from library.serve_app import build_app

    config = SleaConfig.model_validate({"eval": {"every": 5}})
    assert ActorPool._options(SimpleNamespace(config=config))["runtime_env"] == HIDDEN

    evaluator = _FakeActorClass()
    monkeypatch.setattr(driver.train_eval, "PanelEvaluator", evaluator)
    train._start_evaluator(config, tmp_path)
    assert evaluator.options_seen[0]["runtime_env"] == HIDDEN

    writer = _FakeActorClass()
    monkeypatch.setattr(library.process, "LibraryProcess", writer)
    monkeypatch.setattr(library.service, "start_serve_app", lambda *args: None)
    train._start_library(config, tmp_path)
    assert writer.options_seen[0]["runtime_env"] == HIDDEN

    learner_options = []
    monkeypatch.setattr(learner.process, "start_learner", lambda cfg, **options: learner_options.append(options) or [])
    train._start_learner(config, tmp_path)
    assert learner_options[0]["runtime_env"] == HIDDEN

    replica = build_app(config, "redis://127.0.0.1:1")._bound_deployment.ray_actor_options
    assert replica["runtime_env"] == HIDDEN and replica["num_gpus"] == 0


def test_a_process_given_a_gpu_is_not_hidden(monkeypatch, tmp_path):
    from actors.pool import ActorPool

    config = SleaConfig.model_validate({"actors": {"num_gpus": 0.5}})
    assert ActorPool._options(SimpleNamespace(config=config)) == {"num_cpus": config.actors.num_cpus, "num_gpus": 0.5}
