import pytest


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """Generated games, compiled games and solvability verdicts go to a fresh cache dir per module,
    so the tests exercise generation, compilation and verification instead of a previous run's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLEA_CACHE_DIR", str(tmp_path_factory.mktemp("slea-cache")))
        yield
