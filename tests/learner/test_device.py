"""The learner's device decision as a pure function over what Ray and torch report, and the
one real call this CPU machine can make (no CUDA: num_gpus > 0 must fail, naming the fix)."""

import pytest
import ray
import torch

from learner.device import DeviceError, hide_unassigned_gpus, memory_fraction, plan_device, training_device


def test_a_ray_actor_that_asked_for_no_gpu_trains_on_the_cpu_and_refuses_visible_gpus():
    assert plan_device(0, cuda_available=False, gpu_ids=[], visible_devices="").device == "cpu"
    # Ray 2.60 leaves a GPU node's devices visible to a num_gpus=0 actor: DeepSpeed would take one.
    with pytest.raises(DeviceError, match="hide_unassigned_gpus"):
        plan_device(0, cuda_available=True, gpu_ids=[], visible_devices=None)


def test_a_ray_actor_trains_on_the_gpu_ray_assigned():
    # Ray narrowed CUDA_VISIBLE_DEVICES to the assigned GPU: it is device 0 of this process.
    assert plan_device(1, True, ["3"], "3").device == "cuda:0"
    # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: the id's position among the visible devices.
    assert plan_device(1, True, ["3"], "1,3").device == "cuda:1"
    assert plan_device(1, True, ["2"], None).device == "cuda:2"
    with pytest.raises(DeviceError, match="assigned this actor no GPU"):
        plan_device(1, True, [], "0")


def test_num_gpus_without_cuda_fails_inside_and_outside_ray():
    for gpu_ids in (None, ["0"]):
        with pytest.raises(DeviceError, match=r"learner.num_gpus=0.5 but this process sees no CUDA device"):
            plan_device(0.5, cuda_available=False, gpu_ids=gpu_ids, visible_devices=None)


def test_outside_ray_the_process_owns_what_it_sees():
    assert plan_device(0, False, None, None).device == "cpu"
    assert plan_device(0, True, None, None, local_rank=1) == plan_device(1, True, None, None, local_rank=1)
    assert plan_device(1, True, None, None, local_rank=1).device == "cuda:1"


def test_a_shared_gpu_caps_the_learners_memory_at_its_share():
    assert [memory_fraction(n) for n in (0, 0.25, 0.5, 1, 2)] == [None, 0.25, 0.5, None, None]
    assert plan_device(0.5, True, ["0"], "0").memory_fraction == 0.5
    assert plan_device(1, True, ["0"], "0").memory_fraction is None
    assert plan_device(0, False, [], "").memory_fraction is None


def test_only_a_rank_without_gpus_hides_them():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert not hide_unassigned_gpus(0.5, environ) and environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert hide_unassigned_gpus(0, environ) and environ["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without CUDA")
def test_training_device_here_is_the_cpu_and_a_gpu_request_fails_clearly():
    assert not ray.is_initialized()  # outside Ray: the process's own view
    assert training_device(0) == torch.device("cpu")
    with pytest.raises(DeviceError, match="Install the CUDA build of torch"):
        training_device(1)
