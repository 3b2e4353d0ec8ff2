"""Library test fixtures: the real MiniLM model, loaded once per session (~10 s)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: the model ships in a pip package

from library.embedding import Embedder  # noqa: E402


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder()
