"""`slea doctor`'s GPU line: a driver too old for CUDA 13 is named as such (with torch's own
warning), not reported as "no GPU"; and the image, the deploy guide and the doctor agree on the
CUDA and the driver minimum."""

from __future__ import annotations

import re
from pathlib import Path

from driver.doctor import GPU_CUDA, MIN_DRIVER, gpu_check

REPO = Path(__file__).resolve().parents[2]
TOO_OLD = "CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."


def test_a_usable_gpu_is_reported_with_its_cuda_and_driver():
    check = gpu_check("580.65.06", True, "13.0", "1 x NVIDIA H100 80GB HBM3")
    assert check.ok and not check.required
    assert check.detail == "1 x NVIDIA H100 80GB HBM3, CUDA 13.0, driver 580.65.06"


def test_an_old_driver_is_named_with_torchs_warning_and_the_fix():
    check = gpu_check("570.124.06", False, "13.0", "", TOO_OLD)
    assert not check.ok
    assert "driver 570.124.06" in check.detail and TOO_OLD in check.detail
    assert check.fix == "upgrade the NVIDIA driver to >= 580 (CUDA 13.0)"


def test_a_new_enough_driver_that_still_fails_points_at_the_warning():
    check = gpu_check("580.65.06", False, "13.0", "", "CUDA unknown error")
    assert not check.ok and check.fix == "see torch's warning" and "CUDA unknown error" in check.detail


def test_no_driver_and_a_cpu_torch_are_told_apart():
    assert "no NVIDIA driver" in gpu_check(None, False, None, "").detail
    cpu_build = gpu_check("580.65.06", False, None, "")
    assert "CPU build" in cpu_build.detail and cpu_build.fix == "install PyPI's torch (CUDA 13.0)"


def test_the_image_and_the_deploy_guide_say_the_doctors_cuda_and_driver():
    dockerfile = (REPO / "deploy/docker/Dockerfile.gpu").read_text()
    assert re.search(r"^ARG CUDA_TAG=(\S+)$", dockerfile, re.M).group(1) == "cu" + GPU_CUDA.replace(".", "")
    guide = (REPO / "deploy/README.md").read_text()
    assert f"NVIDIA driver >= {MIN_DRIVER}" in guide and f"CUDA {GPU_CUDA}" in guide
