"""Point a kustomize overlay's `slea-rl` image at one build (scripts/build_image.sh calls this).

    python scripts/pin_image.py deploy/k8s/overlays/cpu-kind/kustomization.yaml slea-rl:cpu-0123456789ab
    python scripts/pin_image.py deploy/k8s/overlays/gpu/kustomization.yaml REGISTRY/slea-rl@sha256:<digest>

Each build has a tag of its own (`<flavour>-<commit>`) or, once pushed, a digest; a mutable tag
such as `slea-rl:gpu` with IfNotPresent would leave each node running whichever build it pulled
first. Only the `images:` block of the file is rewritten; its comments and the rest stay as they are.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

IMAGE = "slea-rl"
IMAGES_BLOCK = re.compile(r"^images:\n(?:[ ]+.*\n)+", re.M)


def parse_reference(reference: str) -> tuple[str, str, str]:
    """(name, "newTag" or "digest", value) of `name:tag` or `name@sha256:...`; a registry's
    host:port is part of the name, so the tag is what follows the last ':' after the last '/'."""
    if "@" in reference:
        name, digest = reference.split("@", 1)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise ValueError(f"{reference}: the digest must be sha256:<64 hex digits>")
        return name, "digest", digest
    path, _, last = reference.rpartition("/")
    if ":" not in last:
        raise ValueError(f"{reference}: name a build by its tag (name:tag) or its digest (name@sha256:...)")
    image, tag = last.rsplit(":", 1)
    return (f"{path}/{image}" if path else image), "newTag", tag


def pin(kustomization: str, reference: str) -> str:
    """The kustomization's text with its images block naming only `reference` for slea-rl."""
    name, field, value = parse_reference(reference)
    if name.split("/")[-1] != IMAGE:
        raise ValueError(f"{reference}: not a {IMAGE} image")
    if not IMAGES_BLOCK.search(kustomization):
        raise ValueError(f"no images: block to pin {IMAGE} in")
    block = f"images:\n  - name: {IMAGE}\n    newName: {name}\n    {field}: {value}\n"
    return IMAGES_BLOCK.sub(lambda _match: block, kustomization, count=1)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(pin(path.read_text(), argv[1]))
    print(f"{path}: {IMAGE} -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
