#!/usr/bin/env bash
# The TextWorld learning comparison of docs/learning.md: SLEA, GRPO and task-level retrieval, each
# with the seeds given (default "0 1"), one run after the other (two learners do not fit in 24 GiB
# together), from configs/textworld-learning.yaml; then the held-out results by preset (mean and
# range over seeds) into docs/learning/. The first run also evaluates the base model before its
# first update: every run starts from that same policy (and an empty library), so the others skip
# that evaluation and share it as the baseline. Runs go to runs/tw-<preset>-s<seed>; a finished
# run is not repeated (delete its directory to redo it). Each finished run's resolved config and
# held-out evaluation lines are kept in docs/learning/runs/<id>/ (runs/ is not committed), and the
# tables and plots are drawn from every run kept there, so a later session adds seeds to them.
#   bash scripts/learning_comparison.sh            # 6 runs
#   SEEDS="0 1 2" bash scripts/learning_comparison.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${SEEDS:-"0 1"}
presets=${PRESETS:-"slea grpo task_retrieval"}
baseline=true
for seed in $seeds; do
  for preset in $presets; do
    id="tw-${preset}-s${seed}"
    if [ -f "runs/${id}/comparison-done" ] || [ -f "docs/learning/runs/${id}/comparison-done" ]; then
      echo "learning_comparison: ${id} finished earlier, skipped"
      baseline=false
      continue
    fi
    rm -rf "runs/${id}"
    started=$(date +%s)
    .venv/bin/slea train configs/textworld-learning.yaml --set "run.id=${id}" --set "run.seed=${seed}" \
      --set "run.preset=${preset}" --set "eval.before_training=${baseline}"
    echo "learning_comparison: ${id} took $(( $(date +%s) - started )) s" | tee "runs/${id}/comparison-done"
    mkdir -p "docs/learning/runs/${id}"
    cp "runs/${id}/config.yaml" "runs/${id}/comparison-done" "docs/learning/runs/${id}/"
    grep '"eval/' "runs/${id}/metrics.jsonl" > "docs/learning/runs/${id}/metrics.jsonl"
    baseline=false
  done
done
runs=(docs/learning/runs/*/)
.venv/bin/slea compare "${runs[@]}" --by-preset --out docs/learning/success.png
.venv/bin/slea compare "${runs[@]}" --by-preset --key eval/sampled/no_library/success_rate \
  --out docs/learning/success_no_library.png
.venv/bin/slea compare "${runs[@]}" --by-preset --key eval/greedy/no_library/success_rate \
  --out docs/learning/greedy_no_library.png
.venv/bin/slea compare "${runs[@]}" --by-preset --key eval/sampled/no_library/invalid_action_rate \
  --out docs/learning/invalid_actions.png
