#!/usr/bin/env bash
# The GPU smoke check: the CUDA path that no CPU test reaches, on one GPU with the shipped
# SmolLM2, in under 8 minutes. Run from the repository root on a GPU machine (or in the GPU image):
#
#   bash scripts/gpu_check.sh            # the gpu tier, then the learner and actor benchmarks
#
# Order (issue 24): environment -> vLLM alone -> weight update through the object store (checked
# against transformers) and the prefix-cache reset -> one ZeRO-2 bf16 step -> learner and vLLM
# sharing the GPU -> `slea train configs/gpu.yaml` for 2 steps -> the NCCL group under a timeout
# (tests/gpu/test_gpu_path.py, in that order, stopping at the first failure), then
# `slea bench learner --json` and `slea bench actors --json`, whose figures it prints.
set -euo pipefail

PYTHON="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ "${PYTHON}" = python ]; then
  PYTHON=.venv/bin/python
fi

# torch's own warning says why CUDA is unusable ("The NVIDIA driver on your system is too old"):
# shown, never swallowed, with the driver and the CUDA torch was built for (CUDA 13.0 needs >= 580).
if ! torch_said=$("${PYTHON}" -c "import torch, sys; print('torch', torch.__version__, 'built for CUDA', torch.version.cuda)
sys.exit(0 if torch.cuda.is_available() else 1)" 2>&1); then
  echo "gpu_check: CUDA is unusable in ${PYTHON} (torch.cuda.is_available() is False). torch said:" >&2
  echo "${torch_said}" | sed 's/^/  /' >&2
  echo "  NVIDIA driver: $(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1 || echo "none (no nvidia-smi)")" \
       "(PyPI's torch 2.13 is a CUDA 13.0 build: driver >= 580; slea doctor checks it)" >&2
  exit 2
fi
"${PYTHON}" -c "import vllm" 2>/dev/null || {
  echo "gpu_check: vLLM is not installed in ${PYTHON}: pip install 'slea-rl[gpu]'" >&2
  exit 2
}

started=$(date +%s)
echo "== gpu tier (tests/gpu, in the smoke order) =="
"${PYTHON}" -m pytest tests/gpu -m gpu -x -s -q --timeout=480

echo "== slea bench learner --json =="
timeout 300 "${PYTHON}" -m driver.cli bench learner --json | tee /tmp/slea-bench-learner.json
echo "== slea bench actors --json =="
timeout 300 "${PYTHON}" -m driver.cli bench actors --json | tee /tmp/slea-bench-actors.json

"${PYTHON}" - <<'EOF'
import json

def last_object(path):  # the JSON line, whatever a library logged around it
    return json.loads([line for line in open(path) if line.startswith("{")][-1])


learner, actors = last_object("/tmp/slea-bench-learner.json"), last_object("/tmp/slea-bench-actors.json")
keys = ("device", "compute_dtype", "tokens_per_s", "ratio", "mfu", "matmul_tflops", "bf16_over_fp32", "peak_memory_mb")
print("learner:", {k: learner.get(k) for k in keys})
print("actors:", actors)
EOF
echo "gpu_check: done in $(( $(date +%s) - started )) s"
