"""The pod sandbox's stand-in for the CPU image (tests/deploy/image_layout.py) against
deploy/docker/Dockerfile.cpu itself, so the runner cannot drift from the image."""

from __future__ import annotations

from image_layout import DOCKERFILE_CPU, IMAGE_PATHS, REPO, read_dockerfile, slea_image


def test_the_layout_table_covers_every_path_the_image_has():
    dockerfile = read_dockerfile(DOCKERFILE_CPU)
    layout = slea_image({"/opt/slea-cache": REPO, "/opt/hf": REPO})
    assert dockerfile.workdir == layout.workdir == "/app" and "/app" in IMAGE_PATHS
    assert int(dockerfile.user) == layout.uid
    assert {target for _, target in layout.binds} >= set(IMAGE_PATHS)
    for key, value in dockerfile.env.items():
        assert layout.env[key] == value, f"ENV {key}"
        if value.startswith("/"):  # an image path: in the table, or under a volume every pod mounts (/tmp)
            assert value in IMAGE_PATHS or value.startswith("/tmp/"), f"ENV {key}={value} is not in IMAGE_PATHS"
    for source, destination in dockerfile.copies:
        assert (REPO / source).exists(), f"COPY {source}: not in the checkout the runner binds at /app"
        assert not destination.startswith("/") or destination.startswith("/app"), (
            f"COPY to {destination}: outside WORKDIR"
        )
