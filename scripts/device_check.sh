#!/usr/bin/env bash
# The GPU check for an air-gapped GPU node: no package registry; Python 3.12 with CUDA torch,
# transformers, pytest, msgpack and prometheus-client, but no DeepSpeed, pydantic, redis-py, Ray,
# vLLM or redis-server; at most 64 MiB brought to it; about 10 minutes. What it lacks and the
# learner needs travels as files (the "carry", under 64 MiB with the working tree); Ray (a 79 MB
# wheel) and vLLM (326 MB) cannot, so the check runs what needs neither (driver/device_check.py):
#
#   bash scripts/device_check.sh --fetch       # first, where PyPI is reachable: the carry, at
#                                              # constraints.txt's pins, into build/device-carry
#   bash scripts/device_check.sh --dry-run     # the probes, their timeouts, each carried file and
#                                              # the total; refused over 64 MiB or incomplete
#   bash scripts/device_check.sh [OUT_DIR]     # on the node (OUT_DIR: runs/device-check)
#
# On the node, in under 9 minutes: environment.txt (as scripts/gpu_check.sh writes it); cuda;
# install (the carry into a folder of its own: DeepSpeed built from its sdist, no ops compiled);
# learner_step (configs/gpu.yaml's bf16 DeepSpeed learner on a random model of Qwen2.5-1.5B's
# shape: tokens/s, TFLOP/s, MFU against the run's bf16 matmul peak, peak memory against
# learner/memory.py's count); engine_and_handoff (the transformers engine's generation on CUDA, its
# behaviour log-probs against the learner's for the same tokens, the weight hand-off from learner
# to engine in one process). Then summary.json, printed last; 5 files in OUT_DIR in all.
# With the device tool: command `bash scripts/device_check.sh "$OUT"`, carry ["build/device-carry"],
# timeout_s 600. Exit status: 0 when every probe passed, 2 when CUDA is unusable, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/check_lib.sh
source scripts/check_lib.sh

CARRY=${DEVICE_CARRY:-build/device-carry}
LIMIT_MIB=64   # what may travel to the node: the working tree and the carry together
NODE_PYTHON_VERSION=3.12
SITE=/tmp/slea-device-site   # where the carry is installed on the node (PYTHONPATH)
SDISTS=(deepspeed)   # PyPI has only its sdist; built on the node against the node's torch
WHEELS=(pydantic pydantic_core annotated-types typing-inspection typing_extensions redis hjson)
PYTHON=${PYTHON:-python3}

mode=run out=runs/device-check
for arg in "$@"; do
  case ${arg} in
    --fetch) mode=fetch ;;
    --dry-run) mode=dry-run ;;
    -*) echo "usage: bash scripts/device_check.sh [--fetch | --dry-run] [OUT_DIR]" >&2; exit 2 ;;
    *) out=${arg} ;;
  esac
done

pin() {  # NAME: its version in constraints.txt (pip's names: '-' and '_' alike, any case)
  grep -i -E "^${1//[-_]/[-_]}==" constraints.txt | head -1 | sed -E 's/^[^=]+==([^ ]+).*/\1/'
}

fetch() {
  local here=python3 requirements=() name
  [ -x .venv/bin/python ] && here=.venv/bin/python
  for name in "${WHEELS[@]}"; do requirements+=("${name}==$(pin "${name}")"); done
  mkdir -p "${CARRY}"
  "${here}" -m pip download -q --no-deps --no-binary=:all: -d "${CARRY}" "deepspeed==$(pin deepspeed)" &&
    "${here}" -m pip download -q --no-deps --only-binary=:all: --python-version "${NODE_PYTHON_VERSION}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "${CARRY}" "${requirements[@]}"
}

# carried_files: each file of the carry, one a line; says on stderr what is missing or left over
# (two versions of one package stop the whole install) and returns 1 then.
carried_files() {
  local name file missing=() expected=() problems=0
  for name in "${SDISTS[@]}" "${WHEELS[@]}"; do
    # Files name a package with '_' for '-' (wheels) or as published (deepspeed's sdist).
    file=$(compgen -G "${CARRY}/${name//-/_}-$(pin "${name}")[-.]*" | head -1)
    if [ -z "${file}" ]; then
      missing+=("${name}==$(pin "${name}")")
    else
      expected+=("${file}")
      echo "${file}"
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "device_check: ${CARRY} lacks ${missing[*]}: run \`bash scripts/device_check.sh --fetch\` where PyPI is reachable" >&2
    problems=1
  fi
  for file in "${CARRY}"/*; do
    [ -e "${file}" ] || continue
    if [[ " ${expected[*]} " != *" ${file} "* ]]; then
      echo "device_check: ${file} is not what constraints.txt pins: remove it (two versions of one package stop the install)" >&2
      problems=1
    fi
  done
  return "${problems}"
}

mib() {  # BYTES
  awk -v bytes="$1" 'BEGIN { printf "%7.2f MiB", bytes / 1048576 }'
}

# show_plan: the probes as the node would run them, what travels and its size; 1 where the carry is
# incomplete or everything together is over LIMIT_MIB.
show_plan() {
  local files file size carried=0 tree ok=0
  echo "device_check (dry run). On the node, through the device tool: command \`bash scripts/device_check.sh \"\$OUT\"\`," \
    "carry [\"${CARRY}\"], timeout_s 600"
  run_probes 1
  echo "carried (${CARRY}), installed on the node into ${SITE} by the install probe:"
  files=$(carried_files) || ok=1
  for file in ${files}; do
    size=$(stat -c %s "${file}")
    carried=$(( carried + size ))
    echo "  $(mib "${size}")  $(basename "${file}")"
  done
  # What the device tool sends besides: tracked and untracked files that git does not ignore.
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  echo "  $(mib "${carried}")  carried in all"
  echo "  $(mib "${tree}")  the working tree that travels with it (the project itself: PYTHONPATH, no install)"
  echo "  $(mib $(( carried + tree )))  together, of ${LIMIT_MIB} MiB"
  if [ $(( carried + tree )) -gt $(( LIMIT_MIB * 1048576 )) ]; then
    echo "device_check: $(( (carried + tree) / 1048576 )) MiB would travel, over the ${LIMIT_MIB} MiB a node can be sent" >&2
    ok=1
  fi
  return "${ok}"
}

# run_probes DRY_RUN: the probes, in order (a dry run lists them).
run_probes() {
  check_start device_check "${out}" "${DEVICE_CHECK_DEADLINE_S:-540}" "$1"
  [ "$1" = 1 ] || environment_facts "${PYTHON}" >"${out}/environment.txt" 2>&1
  cuda_probe "${PYTHON}" device_check
  cuda_ok=$?
  probe install 240 bash -ec "rm -rf ${SITE}
DS_BUILD_OPS=0 ${PYTHON} -m pip install --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target ${SITE} ${CARRY}/*
${PYTHON} -m pip list --path ${SITE}"
  export PYTHONPATH="${SITE}:${PWD}"
  probe learner_step 240 "${PYTHON}" -m driver.device_check learner_step
  probe engine_and_handoff 180 "${PYTHON}" -m driver.device_check engine_and_handoff
}

case ${mode} in
  fetch) fetch && show_plan ;;
  dry-run) show_plan ;;
  run)
    carried_files >/dev/null || exit 2
    run_probes 0
    check_finish
    status=$?
    [ "${cuda_ok}" = 0 ] || exit 2
    exit "${status}"
    ;;
esac
