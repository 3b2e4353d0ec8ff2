#!/usr/bin/env bash
# The TextWorld learning study of docs/learning.md (issue 21): SLEA and GRPO with 3 seeds each,
# task-level retrieval and SLEA with EDGE with 2 seeds each, one run after the other (two learners
# do not fit in 24 GiB together), from configs/textworld-study.yaml; then every kept run's arms with
# 95% intervals (`slea compare --by-preset`) into docs/learning/. The first run also evaluates the
# base model before its first update: every run starts from that same policy (and an empty
# library), so the others skip that evaluation and share it as the baseline.
#
# Runs go to runs/<id>; each finished run is kept in docs/learning/runs/<id>/ (its resolved config,
# its held-out evaluation and library lines, every held-out episode, the library's listing at each
# evaluation, how long it took), which is committed, and
# a run kept there is not repeated: the study can be completed across sessions, a run at a time.
#   bash scripts/learning_comparison.sh                    # every arm and seed not kept yet
#   ARMS="grpo:0" bash scripts/learning_comparison.sh      # one run (preset[+edge]:seed ...)
#   CONFIG=configs/textworld-learning.yaml ...             # another setting
set -euo pipefail
cd "$(dirname "$0")/.."
config=${CONFIG:-configs/textworld-study.yaml}
arms=${ARMS:-"slea:0 grpo:0 slea:1 grpo:1 task_retrieval:0 slea+edge:0 slea:2 grpo:2 task_retrieval:1 slea+edge:1"}
kept_root=docs/learning/runs
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
  .venv/bin/slea train "${config}" --set "run.id=${id}" --set "run.seed=${seed}" --set "run.preset=${preset}" \
    --set "run.edge=${edge}" --set "eval.before_training=${baseline}"
  echo "learning_comparison: ${id} took $(( $(date +%s) - started )) s on $(nproc) cores" | tee "runs/${id}/comparison-done"
  mkdir -p "${kept_root}/${id}"
  cp "runs/${id}/config.yaml" "runs/${id}/comparison-done" "${kept_root}/${id}/"
  grep -E '"(eval|library|learner)/' "runs/${id}/metrics.jsonl" > "${kept_root}/${id}/metrics.jsonl"
  (cd "runs/${id}" && find eval -name library.md -exec cp --parents {} "../../${kept_root}/${id}/" \;)
  .venv/bin/python -c "import sys; from pathlib import Path; from driver.study import keep_episodes; \
keep_episodes(Path(sys.argv[1]), Path(sys.argv[2]))" "runs/${id}" "${kept_root}/${id}"
  baseline=false
done
.venv/bin/slea compare "${kept_root}"/*/ --by-preset --out-dir docs/learning | tee docs/learning/study.md
