"""A run past its restart budget (issue 22, item 1): with run.max_failures=0 the first learner death
stops `slea train` with exit 1 and a message naming the learner and its error, after the usual
shutdown, so the library still takes its final snapshot. Restarts within the budget are
tests/driver/test_supervision.py (the supervisor alone) and tests/test_chaos.py (a whole run
under repeated faults).

Only the test's own processes are killed (tests/helpers.py TaggedRay); never `ray stop`.
"""

import re
import signal
import time

import pytest
from helpers import broken_run, output_tail, start_train, trained_trace

from library.persistence import latest_snapshot
from slea.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.whole_run  # slow too (tests/conftest.py)


@pytest.fixture
def server(tmp_path):
    redis_server = EmbeddedRedis(tmp_path / "redis", appendonly=True).start()
    yield redis_server
    redis_server.stop()


def _train_two_steps(cluster, server, tmp_path, model_dir, run_id: str, settings: list[str]):
    """`slea train` of a broken_run() with `settings`, once its learner has trained two steps:
    (the driver's process, its log, the run directory)."""
    run_dir = tmp_path / run_id
    address = cluster.start_head("--num-cpus=4", "--include-dashboard=false")
    log = tmp_path / "train.log"
    started = time.monotonic()
    driver = start_train(cluster, [*broken_run(tmp_path, run_id, model_dir, server.url, address), *settings], log)
    while len(trained_trace(run_dir)) < 2:
        if driver.poll() is not None or time.monotonic() - started >= 180:
            driver.kill()
            driver.wait()
            raise AssertionError(f"no two trained steps in 180 s (exit {driver.returncode}):\n{output_tail(log)}")
        time.sleep(0.2)
    return driver, log, run_dir


def test_past_max_failures_the_run_stops_naming_the_component_and_the_library_still_snapshots(
    cluster, server, tmp_path, tiny_model_dir
):
    """run.max_failures=0: the first learner death stops the run (exit 1) with a message naming the
    learner and its error, after the usual shutdown: the library's only snapshot (snapshot_every and
    snapshot_max_age_s out of reach) is the final one, taken after the learner died."""
    driver, log, run_dir = _train_two_steps(
        cluster,
        server,
        tmp_path,
        tiny_model_dir,
        "budget",
        [
            "run.max_failures=0",
            "learner.max_steps=1000",
            "library.snapshot_every=100000",
            "library.snapshot_max_age_s=100000",
        ],
    )
    try:
        assert latest_snapshot(run_dir) is None, "a snapshot before the end: raise library.snapshot_every"
        assert cluster.signal("ray::LearnerProcess", signal.SIGKILL) == 1
        driver.wait(timeout=180)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    output = log.read_text(errors="replace")
    assert driver.returncode == 1, f"slea train exited {driver.returncode}:\n{output_tail(log)}"
    assert re.search(r"slea: the learner died \(.+\) after 0 restart\(s\).+run\.max_failures=0", output), output[-3000:]
    assert latest_snapshot(run_dir) is not None, f"no final library snapshot:\n{output_tail(log)}"


def test_a_learner_stopped_with_sigstop_is_restarted_as_hung_and_the_run_finishes(
    cluster, server, tmp_path, tiny_model_dir
):
    """Issue 36, item 3: a learner that hangs (SIGSTOP: alive to Ray, answering nothing, reading
    nothing) while the actors' steps wait for it is restarted after run.hang_timeout_s, as if it
    had died: the driver says so, the new learner trains on from the checkpoint, and the run ends
    normally. Before the heartbeat the driver's next call into the learner blocked for ever."""
    driver, log, run_dir = _train_two_steps(
        cluster,
        server,
        tmp_path,
        tiny_model_dir,
        "hang",
        ["run.hang_timeout_s=20", "learner.checkpoint_every=1", "learner.max_steps=5"],
    )
    try:
        assert cluster.signal("ray::LearnerProcess", signal.SIGSTOP) == 1
        driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            cluster.signal("ray::LearnerProcess", signal.SIGCONT)
            driver.kill()
            driver.wait()
    output = log.read_text(errors="replace")
    assert driver.returncode == 0, f"slea train exited {driver.returncode}:\n{output_tail(log)}"
    assert re.search(r"learner died \(hung: no stream entry read for \d+ s while \d+ waited", output), output[-3000:]
    assert max(line["learner_step"] for line in trained_trace(run_dir)) == 5
