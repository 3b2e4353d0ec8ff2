#!/usr/bin/env bash
# The TextWorld learning study of docs/learning.md (issue 37, "How the study of issue 37 was run"): SLEA against GRPO
# only, training seeds 0-7 for both arms (a seed's two runs share its task stream, so the
# difference is paired by seed), one run after the other (two learners do not fit in 24 GiB
# together), from configs/textworld-study.yaml (16 updates of 8 episodes; held-out evaluations before
# the first update and after the last); then every kept run's arms with 95% intervals over seeds and
# over tasks (`slea compare --by-preset`) into the kept folder's study.md. The first run also
# evaluates the base model before its first update: every run starts from that same policy (and an
# empty library), so the others skip that evaluation and share it as the baseline.
#
# Runs go to runs/<id>; each finished run is kept in ${KEPT_ROOT}/<id>/ (its resolved config,
# its held-out evaluation and library lines, every held-out episode, the library's listing at each
# evaluation, how long it took), which is committed, and
# a run kept there is not repeated: the study can be completed across sessions, a run at a time.
#   bash scripts/learning_comparison.sh                    # every arm and seed not kept yet
#   ARMS="grpo:0" bash scripts/learning_comparison.sh      # one run (preset[+edge]:seed ...)
# The first study (issue 21; 4 arms, 2-3 seeds, tw-simple on its panel) is kept in docs/learning/runs/
# with the config each run resolved; its command was CONFIG=<that config> KEPT_ROOT=docs/learning/runs
# ARMS="slea:0 grpo:0 slea:1 grpo:1 task_retrieval:0 slea+edge:0 slea:2 grpo:2 task_retrieval:1 slea+edge:1".
# The study runs the code of the checkout this script is in, whichever venv runs it: a study spans
# sessions, so it can run from a git worktree pinned at one commit
#   git worktree add ../study <commit>
#   VENV=$PWD/.venv KEPT_ROOT=$PWD/docs/learning/slea-vs-grpo bash ../study/scripts/learning_comparison.sh
# while work goes on here (each kept run records the commit and the CPU it ran on).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PWD}${PYTHONPATH:+:${PYTHONPATH}}"
venv=${VENV:-.venv}
config=${CONFIG:-configs/textworld-study.yaml}
arms=${ARMS:-"slea:0 grpo:0 slea:1 grpo:1 slea:2 grpo:2 slea:3 grpo:3 slea:4 grpo:4 slea:5 grpo:5 slea:6 grpo:6 slea:7 grpo:7"}
kept_root=$(realpath -m "${KEPT_ROOT:-docs/learning/slea-vs-grpo}")
baseline=true
if [ -n "$(ls -A "${kept_root}" 2>/dev/null)" ]; then
  baseline=false  # a kept run already holds the base model's evaluation
fi
for arm in ${arms}; do
  preset=${arm%%:*}
  seed=${arm##*:}
  edge=false
  id="tw-${preset}-s${seed}"
  if [[ ${preset} == *+edge ]]; then
    edge=true
    preset=${preset%+edge}
    id="tw-${preset}-edge-s${seed}"
  fi
  if [ -f "${kept_root}/${id}/comparison-done" ]; then
    echo "learning_comparison: ${id} is kept already, skipped"
    continue
  fi
  rm -rf "runs/${id}"
  started=$(date +%s)
  "${venv}/bin/slea" train "${config}" --set "run.id=${id}" --set "run.seed=${seed}" --set "run.preset=${preset}" \
    --set "run.edge=${edge}" --set "eval.before_training=${baseline}"
  cpu="$(lscpu | sed -n 's/^Model name: *//p'), $(grep -o -m1 -E 'amx_bf16|avx512_bf16' /proc/cpuinfo || echo 'no native bf16')"
  echo "learning_comparison: ${id} took $(( $(date +%s) - started )) s on $(nproc) cores (${cpu}) at commit $(git rev-parse --short HEAD)" \
    | tee "runs/${id}/comparison-done"
  mkdir -p "${kept_root}/${id}"
  cp "runs/${id}/config.yaml" "runs/${id}/comparison-done" "${kept_root}/${id}/"
  grep -E '"(eval|library|learner)/' "runs/${id}/metrics.jsonl" > "${kept_root}/${id}/metrics.jsonl"
  (cd "runs/${id}" && find eval -name library.md -exec cp --parents {} "${kept_root}/${id}/" \;)
  "${venv}/bin/python" -c "import sys; from pathlib import Path; from driver.study import keep_episodes; \
keep_episodes(Path(sys.argv[1]), Path(sys.argv[2]))" "runs/${id}" "${kept_root}/${id}"
  baseline=false
done
"${venv}/bin/slea" compare "${kept_root}"/*/ --by-preset --out-dir "${kept_root}" | tee "${kept_root}/study.md"
