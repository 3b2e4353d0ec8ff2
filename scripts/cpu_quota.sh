#!/usr/bin/env bash
# Run a command, and every process it starts (Ray's raylet and workers included), on a CPU-time
# quota of this machine: a stand-in for a slower machine of the same core count, to time the
# README's first command against a target set on a machine this session does not have (issue 39:
# 8 minutes where `slea bench learner` reads an fp32 peak of 0.063 TFLOP/s). Run
# `slea bench learner` under the same quota: the peak it reads there is the figure to quote, not
# the quota. A quota slows compute alone; memory bandwidth and latency stay this machine's.
#   sudo scripts/cpu_quota.sh 0.68 .venv/bin/slea bench learner --json    # 0.68 CPUs of time, 2 cores
#   sudo scripts/cpu_quota.sh 0.68 .venv/bin/slea train configs/local.yaml --set actors.dtype=float32
# Needs root (a cgroup of its own, v2 cpu.max or v1 cpu.cfs_quota_us); removed when the command ends.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: scripts/cpu_quota.sh CPUS COMMAND [ARGS...]   (CPUS: CPU-seconds per second, e.g. 0.68)" >&2
  exit 2
fi
cpus=$1
shift
period_us=10000  # short periods: 2 busy threads are throttled in 10 ms slices, not 100 ms stalls
if ! [[ ${cpus} =~ ^[0-9]*\.?[0-9]+$ ]] || [ "$(awk -v q="${cpus}" 'BEGIN { print (q > 0) }')" != 1 ]; then
  echo "cpu_quota: CPUS must be a number of CPUs above 0, got '${cpus}'" >&2
  exit 2
fi
quota_us=$(awk -v q="${cpus}" -v p="${period_us}" 'BEGIN { v = int(q * p + 0.5); print (v < 1000 ? 1000 : v) }')
name="slea-cpu-quota-$$"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  group="/sys/fs/cgroup/${name}"
  mkdir "${group}"
  echo "${quota_us} ${period_us}" > "${group}/cpu.max"
else
  group="/sys/fs/cgroup/cpu/${name}"
  mkdir "${group}"
  echo "${period_us}" > "${group}/cpu.cfs_period_us"
  echo "${quota_us}" > "${group}/cpu.cfs_quota_us"
fi
cleanup() {
  # a cgroup is removed once empty: move anything left (a daemon the command left behind) to the root
  while read -r pid; do echo "${pid}" > "$(dirname "${group}")/cgroup.procs" 2>/dev/null || true; done < "${group}/cgroup.procs"
  rmdir "${group}" 2>/dev/null || true
}
trap cleanup EXIT
echo "cpu_quota: ${cpus} CPUs of time (${quota_us} us per ${period_us} us) for: $*" >&2
set +e
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' quota "${group}" "$@"
status=$?
set -e
exit "${status}"
