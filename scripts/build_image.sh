#!/usr/bin/env bash
# Build one of the images under a tag of its own, <flavour>-<commit>, never a mutable `cpu`/`gpu`
# tag, and point its overlay at that build (scripts/pin_image.py):
#   bash scripts/build_image.sh cpu                  # slea-rl:cpu-<commit>, loaded into kind if kind is here
#   bash scripts/build_image.sh gpu REGISTRY         # REGISTRY/slea-rl:gpu-<commit>, pushed; the overlay gets its digest
# The tree must be committed: the tag names the commit the image holds. Commit the overlay's
# change afterwards, so the manifests say which build they run.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/build_image.sh cpu|gpu [REGISTRY]"
flavour=${1:?${usage}}
registry=${2:-}
case ${flavour} in
  cpu) overlay=deploy/k8s/overlays/cpu-kind ;;
  gpu) overlay=deploy/k8s/overlays/gpu ;;
  *) echo "${usage}" >&2; exit 2 ;;
esac
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "build_image: commit your changes first: the tag names the commit the image is built from" >&2
  exit 2
fi
name="${registry:+${registry}/}slea-rl"
reference="${name}:${flavour}-$(git rev-parse --short=12 HEAD)"
DOCKER_BUILDKIT=1 docker build -f "deploy/docker/Dockerfile.${flavour}" -t "${reference}" .
if [ -n "${registry}" ]; then
  docker push "${reference}"
  reference=$(docker inspect --format '{{index .RepoDigests 0}}' "${reference}")  # name@sha256:...
elif [ "${flavour}" = cpu ] && command -v kind >/dev/null; then
  kind load docker-image "${reference}"
fi
python3 scripts/pin_image.py "${overlay}/kustomization.yaml" "${reference}"
