"""The driver's GPU check: the run's GPU requests packed onto the cluster's GPUs as Ray places
them, by hand-worked cases, and the real cluster's GPU count read from a local Ray."""

from pathlib import Path

import pytest

from driver.gpu_placement import gpu_requests, gpu_shortfall, unplaceable
from slea.config import load_config

GPU_CONFIG = Path(__file__).resolve().parents[2] / "configs/gpu.yaml"


def test_the_gpu_config_fits_one_gpu_and_not_zero():
    config = load_config(GPU_CONFIG)
    assert gpu_requests(config) == [("learner rank 0", 0.5), ("actor worker 0", 0.5)]
    assert gpu_shortfall(config, [1.0]) is None
    message = gpu_shortfall(config, [0.0])
    assert "learner rank 0 (0.5 GPU)" in message and "actor worker 0 (0.5 GPU)" in message
    assert "nodes have [0] GPUs" in message


def test_fractions_share_a_gpu_only_while_they_fit_in_it():
    assert unplaceable([("a", 0.45), ("b", 0.55)], [1]) == []  # exactly one GPU
    assert unplaceable([("a", 0.6), ("b", 0.6)], [1]) == ["b (0.6 GPU)"]
    # 1.8 GPUs in total on 2 GPUs, but no two of them share one: the third does not fit.
    assert unplaceable([("a", 0.6), ("b", 0.6), ("c", 0.6)], [2]) == ["c (0.6 GPU)"]


def test_whole_gpu_requests_need_whole_gpus_of_one_node():
    assert unplaceable([("learner", 2)], [1, 1]) == ["learner (2 GPU)"]  # two GPUs, but on two nodes
    assert unplaceable([("learner", 2)], [2]) == []
    assert unplaceable([("a", 0.5), ("learner", 1)], [1]) == ["a (0.5 GPU)"]  # the largest goes first


def test_more_ranks_workers_and_the_evaluator_all_count():
    config = load_config(
        GPU_CONFIG,
        ["learner.num_ranks=2", "learner.num_gpus=1", "actors.num_workers=3", "actors.num_gpus=0.5", "eval.every=5"],
    )
    config.eval.num_gpus = 0.25
    assert sum(gpus for _who, gpus in gpu_requests(config)) == 2 + 1.5 + 0.25
    assert gpu_shortfall(config, [4]) is None
    assert "actor worker" in gpu_shortfall(config, [3])


@pytest.mark.slow
def test_the_gpus_of_a_real_local_ray():
    import ray

    from driver.gpu_placement import cluster_gpus_per_node

    ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        assert cluster_gpus_per_node() == [0.0]
        assert "nothing would place" in gpu_shortfall(load_config(GPU_CONFIG), cluster_gpus_per_node())
    finally:
        ray.shutdown()
