# Sourced by scripts/gpu_check.sh and scripts/device_check.sh (not run): the environment facts,
# one probe at a time under its own timeout and the check's deadline, and summary.json.
#
# A check's folder holds at most 8 files (what a device machine hands back): environment.txt (the
# CUDA probe's output goes there too), one log per other probe (N-NAME.log, stdout and stderr
# together, in order) and summary.json (scripts/check_summary.py), rewritten after every probe and
# printed last. A probe that fails does not stop the next (no `pytest -x`): each one's evidence is
# kept. A probe still running at its timeout gets SIGINT (Python prints where it was), SIGKILL 30 s
# later; none starts with less than CHECK_MIN_LEFT_S (20) seconds of the check's deadline left.

SUMMARY_PYTHON=$(command -v python3 || echo "${PYTHON:-python}")  # the writer needs only the standard library

# check_start NAME OUT_DIR DEADLINE_S DRY_RUN(0|1)
check_start() {
  check=$1 out=$2 deadline_s=$3 dry_run=$4
  deadline=$(( $(date +%s) + deadline_s )) probe_count=0 log_count=0 skip_reason=""
  if [ "${dry_run}" = 1 ]; then
    echo "probes, in order, each under its own timeout, all under a ${deadline_s} s deadline (dry run: none runs):"
    return 0
  fi
  mkdir -p "${out}"
  rm -f "${out}"/[0-9]*-*.log "${out}/summary.json" "${out}/environment.txt"
  figures_dir=$(mktemp -d)
  trap 'rm -rf "${figures_dir}"' EXIT
  summary start "${check}" "${deadline_s}"
}

summary() {  # COMMAND ARGS...: scripts/check_summary.py on this check's summary.json
  "${SUMMARY_PYTHON}" scripts/check_summary.py "$1" "${out}/summary.json" "${@:2}"
}

# probe NAME TIMEOUT_S COMMAND...: run COMMAND for at most TIMEOUT_S or what is left of the
# deadline, its output in N-NAME.log (appended to $probe_log instead, where that is set); the
# figures it writes to $SLEA_CHECK_FIGURES go into summary.json. A dry run lists it ($probe_shows
# in place of COMMAND, where that is set). Returns COMMAND's exit status (1 for a skipped probe).
probe() {
  local name=$1 limit=$2 left started rc status log
  shift 2
  probe_count=$(( probe_count + 1 ))
  if [ -n "${probe_log:-}" ]; then
    log=${probe_log}
  else
    log_count=$(( log_count + 1 ))
    log="${log_count}-${name}.log"
  fi
  if [ "${dry_run}" = 1 ]; then
    printf '  %d  %-20s %4d s  %s\n' "${probe_count}" "${name}" "${limit}" "${probe_shows:-$*}" \
      | sed '2,$s/^/                                  /'
    return 0
  fi
  left=$(( deadline - $(date +%s) ))
  if [ -z "${skip_reason}" ] && [ "${left}" -lt "${CHECK_MIN_LEFT_S:-20}" ]; then
    skip_reason="under ${CHECK_MIN_LEFT_S:-20} s of the check's ${deadline_s} s deadline was left"
  fi
  if [ -n "${skip_reason}" ]; then
    echo "== ${name}: skipped: ${skip_reason}"
    summary add "${name}" skipped 0 "${limit}" "" "" "${skip_reason}"
    return 1
  fi
  [ "${limit}" -gt "${left}" ] && limit=${left}
  echo "== ${name} (at most ${limit} s; log ${out}/${log})"
  started=$(date +%s.%N)
  [ -n "${probe_log:-}" ] || : >"${out}/${log}"
  SLEA_CHECK_FIGURES="${figures_dir}/${name}.json" timeout -s INT -k 30 "${limit}" "$@" >>"${out}/${log}" 2>&1
  rc=$?
  case ${rc} in
    0) status=passed ;;
    124 | 137) status=timeout ;;
    *) status=failed ;;
  esac
  summary add "${name}" "${status}" "${started}" "${limit}" "${log}" "${figures_dir}/${name}.json"
  echo "   ${status} (exit ${rc})"
  return "${rc}"
}

# Every probe after this one is skipped, saying why.
skip_the_rest() {
  skip_reason=$1
}

# check_finish: summary.json, printed last; the check's exit status (0: every probe passed).
check_finish() {
  echo "== summary.json (${out}/summary.json)"
  summary finish
}

# What the CUDA probe runs: torch's own words on CUDA (the warning says why it is unusable: "The
# NVIDIA driver on your system is too old"), the GPU, NCCL and bf16, as figures and as lines.
# shellcheck disable=SC2016
CUDA_FACTS='
import json, os, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    available = torch.cuda.is_available()
facts = {"torch": torch.__version__, "built_for_cuda": torch.version.cuda, "cuda_available": available,
         "warnings": [str(w.message) for w in caught]}
if available:
    props = torch.cuda.get_device_properties(0)
    facts.update(gpu=props.name, gpus=torch.cuda.device_count(), capability=f"{props.major}.{props.minor}",
                 memory_gib=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported(),
                 nccl=".".join(map(str, torch.cuda.nccl.version())))
print("torch", torch.__version__, "built for CUDA", torch.version.cuda, "cuda available:", available)
for warning in caught:
    print(f"{warning.category.__name__}: {warning.message}")
if os.environ.get("SLEA_CHECK_FIGURES"):
    open(os.environ["SLEA_CHECK_FIGURES"], "w").write(json.dumps(facts))
raise SystemExit(0 if available else 1)
'

# cuda_probe PYTHON CHECK: the first probe; where CUDA is unusable it says why on stderr, in
# torch's words and with the driver's version, and skips every later probe.
cuda_probe() {
  local facts=0
  if [ "${dry_run}" = 0 ]; then
    echo "== the cuda probe" >>"${out}/environment.txt"
    facts=$(wc -l <"${out}/environment.txt")
  fi
  probe_log=environment.txt probe_shows="$1 -c \"\${CUDA_FACTS}\" (scripts/check_lib.sh), output into environment.txt" \
    probe cuda 120 "$1" -c "${CUDA_FACTS}" && return 0
  [ "${dry_run}" = 1 ] && return 0
  {
    echo "$2: CUDA is unusable in $1 (torch.cuda.is_available() is False). torch said:"
    tail -n +$(( facts + 1 )) "${out}/environment.txt" | sed 's/^/  /'
    echo "  NVIDIA driver: $(nvidia_driver)" \
      "(PyPI's torch 2.13 is a CUDA 13.0 build: driver >= 580; slea doctor checks it)"
  } >&2
  skip_the_rest "CUDA is unusable (probe cuda)"
  return 1
}

nvidia_driver() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1
  else
    echo "none (no nvidia-smi)"
  fi
}

version_of() {  # COMMAND: its --version, or that it is not installed
  if command -v "$1" >/dev/null; then "$1" --version 2>&1; else echo "not installed"; fi
}

# environment_facts PYTHON: what a GPU run depends on, one fact after another, never failing
# (a missing tool is a fact too). Written to environment.txt before anything is installed.
environment_facts() {
  local python=$1
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm); $(nproc) CPUs; $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 2^20}' /proc/meminfo)"
  echo "checkout: $(git rev-parse --short HEAD 2>/dev/null || echo "no git")"
  echo "NVIDIA driver: $(nvidia_driver)"
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1; else echo "no nvidia-smi"; fi
  echo "== python: ${python}"
  "${python}" --version 2>&1
  "${python}" -c "${CUDA_FACTS}" 2>&1
  echo "Python.h (DeepSpeed's and Triton's builds need it): $("${python}" -c 'import os, sysconfig
path = os.path.join(sysconfig.get_paths()["include"], "Python.h")
print(path, "present" if os.path.exists(path) else "MISSING (python3-dev)")' 2>&1)"
  echo "gcc: $(version_of gcc | head -1)"
  echo "nvcc: $(version_of nvcc | tail -1)"
  echo "== packages"
  "${python}" -m pip list 2>/dev/null \
    | grep -i -E '^(torch|vllm|deepspeed|transformers|ray|redis|pydantic|pydantic.core|msgpack|prometheus.client|pytest|pytest.xdist|pytest.timeout|triton|nvidia.nccl.*|flash.attn) ' \
    || echo "(pip list failed)"
  echo "== redis-server (configs/gpu.yaml's embedded Redis: the stream needs >= 6.2, MINID)"
  version_of redis-server
  echo "== /dev/shm (vLLM's weight staging; Ray's object store)"
  df -h /dev/shm 2>&1
  echo "== disk"
  df -h . /tmp 2>&1
}
