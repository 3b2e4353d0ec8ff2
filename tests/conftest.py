"""Shared fixtures: a real redis-server per test module, flushed between tests; the two tiers.

`pytest -m "not slow" -n auto` is the unit tier (the inner loop, on every core); `pytest -n auto`
runs everything, the slow tests in two lanes, one test at a time each (tests/slow_lane.py: the
whole runs in one, the other slow tests in the other), and the unit tests on every worker, except
that tests marked `gpu` (tests/gpu) are deselected where CUDA is absent
(`pytest -m gpu` on a GPU machine, or scripts/gpu_check.sh, runs that tier): a GPU is a kind of
machine, not a tool to install, and under CI a skip fails the run. A test is slow when it starts
Ray, Ray Serve or DeepSpeed, loads a model (SmolLM2, the tiny test model, the MiniLM embedder) or
runs a command that does. A test that uses one of HEAVY_FIXTURES (itself
or through another fixture) is marked here; a test that does the heavy thing itself carries the
mark (`pytestmark = pytest.mark.slow` for a whole module, else `@pytest.mark.slow`); one that starts
Ray without it fails, so the unit tier stays fast as tests are added.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest
import redis
import slow_lane
from required_tools import under_ci

from driver.ray_disk import GIB, DiskTooFull, require_disk_room
from slea.embedded_redis import EmbeddedRedis

_RAY_TMPDIR = tempfile.mkdtemp(prefix="slea-tests-")
SUITE_DISK_BYTES = 4 * GIB  # a whole run wrote up to 2.7 GiB at once on a fresh clone (README, Tests)


def pytest_configure(config):
    """Every Ray the suite starts in-process or in a `slea train` it runs keeps its sessions under a
    directory of this run's own (RAY_TMPDIR; short, for Ray's socket paths), not in /tmp/ray where a
    user's cluster keeps its session_latest. A cluster a test starts with `ray start` gets its own
    (tests/helpers.py TaggedRay)."""
    os.environ["RAY_TMPDIR"] = _RAY_TMPDIR
    try:  # a raylet on a full disk fails tests one by one far from the cause: stop here with the reason
        require_disk_room(spare_bytes=SUITE_DISK_BYTES)
    except DiskTooFull as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A private redis-server (AOF on, so restart tests keep acknowledged data) for one test module."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), appendonly=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """URL of a freshly flushed server."""
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url) -> redis.Redis:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def cluster():
    """A Ray cluster of the test's own, with token authentication as on KubeRay (tests/helpers.py
    TaggedRay: `cluster.start_head(...)` starts it); its processes, and only they, go at the end."""
    from helpers import token_ray

    ray_cluster = token_ray()
    yield ray_cluster
    ray_cluster.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A checkpoint directory of the tiny test policy (loadable by name like any model)."""
    from slea.models import tiny_model

    path = tmp_path_factory.mktemp("tiny-policy")
    model, tokenizer = tiny_model(seed=1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def policy_tokenizer(tiny_model_dir):
    """The test policy's tokenizer (the real SmolLM2 one), loaded by model name as the writer loads it."""
    from slea.models import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


# tiny_model_dir/policy_tokenizer: the tiny model; ray_cluster (tests/actors), local_ray (tests/learner):
# a local Ray; embedder (tests/library): MiniLM.
HEAVY_FIXTURES = frozenset({"tiny_model_dir", "policy_tokenizer", "ray_cluster", "local_ray", "embedder"})


def pytest_collection_modifyitems(config, items):
    gpu_items = []
    for item in items:
        if HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("whole_run") is not None:
            item.add_marker(pytest.mark.slow)  # a whole run is never in the unit tier
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.slow)  # a GPU test loads models and engines: never in the unit tier
            gpu_items.append(item)
    if gpu_items:
        import torch  # only when a GPU test was collected: the unit tier does not pay for it

        if not torch.cuda.is_available():
            config.hook.pytest_deselected(items=gpu_items)
            items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
    slow_lane.write_lanes(config, items)  # under `pytest -n`: the controller's two lanes


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    slow_lane.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return slow_lane.make_scheduler(config, log)


_RAY_BEFORE = pytest.StashKey[tuple[bool, int]]()  # Ray up before the test's setup (a module fixture's), heads started
_ray_heads_started = 0  # GCS servers this process has launched: counted even when the test shut its Ray down again


def _count_ray_heads(event: str, args: tuple) -> None:
    """An audit hook: ray.init() that starts a local Ray launches its gcs_server with subprocess.Popen.
    A test that starts Ray and shuts it down in its own `finally` leaves ray.is_initialized() False,
    so only this sees it (one such unit test timed out on the GCS under load)."""
    global _ray_heads_started
    if event == "subprocess.Popen":
        program = args[1] if isinstance(args[1], str) else (args[1] or [""])[0]
        if os.path.basename(str(program).split(" ", 1)[0]) == "gcs_server":
            _ray_heads_started += 1


sys.addaudithook(_count_ray_heads)


def _ray_running() -> bool:
    ray = sys.modules.get("ray")  # never imported here: a unit test that does not use Ray pays nothing
    return ray is not None and ray.is_initialized()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_RAY_BEFORE] = (_ray_running(), _ray_heads_started)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """The unit tier's guard: a test not marked slow that starts Ray (in its fixtures or its body) fails."""
    result = yield
    running_before, heads_before = item.stash[_RAY_BEFORE]
    started = (_ray_running() and not running_before) or _ray_heads_started > heads_before
    if started and item.get_closest_marker("slow") is None:
        raise pytest.fail.Exception(f"{item.nodeid} starts Ray: mark it slow (see tests/conftest.py)", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skip is a failure: a run that skipped what it could not find proves less than its
    green says. On a developer's clone the skip stays, saying how to install what is missing."""
    return _skip_fails_under_ci((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped while it is collected."""
    return _skip_fails_under_ci((yield))


def _skip_fails_under_ci(report):
    if report.skipped and under_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (CI=true), where every test must run: {reason}"
    return report


def pytest_runtest_logreport(report):
    slow_lane.clock_report(report)  # under `pytest -n`, on the controller: the lanes' time


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Last of the plugins' summaries, after --durations, so that CI's output tail (which keeps the
    durations and the short summary) keeps the lanes too."""
    slow_lane.summarize_lanes(terminalreporter)


_exit_status: int | None = None


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave with pytest's own exit status once everything is reported and cached.

    Ray, torch and the embedding model leave native threads behind; tearing the interpreter down
    under them can segfault after every test has passed (seen in CI: 359 passed, exit 139), which
    would turn a green run red. Nothing is left to run at this point, so exit without teardown."""
    shutil.rmtree(_RAY_TMPDIR, ignore_errors=True)
    slow_lane.remove_lane_files(config)
    if _exit_status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
