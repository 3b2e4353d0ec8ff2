"""A hung learner restarted (issue 36, item 3), then a run past its restart budget (issue 22,
item 1): with run.max_failures=1 the hang's restart spends the budget and the next learner death
stops `slea train` with exit 1 and a message naming the learner and its error, after the usual
shutdown, so the library still takes its final snapshot. Restarts within the budget with a run
that ends normally are tests/driver/test_supervision.py (the supervisor alone) and
tests/test_chaos.py (a whole run under repeated faults).

Only the test's own processes are killed (tests/helpers.py TaggedRay); never `ray stop`.
"""

import re
import signal
import time

import pytest
from helpers import broken_run, output_tail, start_train, trained_steps, trained_trace

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


def test_a_hung_learner_is_restarted_and_past_max_failures_the_run_stops_naming_it(
    cluster, server, tmp_path, tiny_model_dir
):
    """One run, two faults (one `slea train` serves both checks: a whole run is the suite's cost).

    Issue 36, item 3: a learner that hangs (SIGSTOP: alive to Ray, answering nothing, reading
    nothing) while the actors' steps wait for it is restarted after run.hang_timeout_s, as if it
    had died: the driver says so and the new learner trains on from the checkpoint. Before the
    heartbeat the driver's next call into the learner blocked for ever.

    Issue 22, item 1: that restart spent run.max_failures=1, so the next learner death stops the
    run (exit 1) with a message naming the learner, its error and the restarts, after the usual
    shutdown: the library's only snapshot (snapshot_every and snapshot_max_age_s out of reach) is
    the final one, taken after the learner died."""
    driver, log, run_dir = _train_two_steps(
        cluster,
        server,
        tmp_path,
        tiny_model_dir,
        "healing",
        [
            "run.max_failures=1",
            "run.hang_timeout_s=20",
            "learner.checkpoint_every=1",
            "learner.max_steps=1000",
            "library.snapshot_every=100000",
            "library.snapshot_max_age_s=100000",
        ],
    )
    try:
        [hung] = cluster.processes("ray::LearnerProcess")
        hung.send_signal(signal.SIGSTOP)
        trained_before = len(trained_steps(run_dir))
        deadline = time.monotonic() + 180
        while len(trained_steps(run_dir)) <= trained_before:  # the new learner's first step of its own
            assert driver.poll() is None and time.monotonic() < deadline, (
                f"no step trained after the hang (exit {driver.returncode}):\n{output_tail(log)}"
            )
            time.sleep(0.2)
        output = log.read_text(errors="replace")
        hang_line = r"learner died \(hung: no stream entry read for \d+ s while \d+ waited"
        assert re.search(hang_line, output), output[-3000:]
        assert latest_snapshot(run_dir) is None, "a snapshot before the end: raise library.snapshot_every"
        # the new learner (the hung one may linger a moment after the driver had Ray kill it)
        [restarted] = [process for process in cluster.processes("ray::LearnerProcess") if process.pid != hung.pid]
        restarted.send_signal(signal.SIGKILL)
        driver.wait(timeout=180)
    finally:
        if driver.poll() is None:
            cluster.signal("ray::LearnerProcess", signal.SIGCONT)
            driver.kill()
            driver.wait()
    output = log.read_text(errors="replace")
    assert driver.returncode == 1, f"slea train exited {driver.returncode}:\n{output_tail(log)}"
    assert re.search(r"slea: the learner died \(.+\) after 1 restart\(s\).+run\.max_failures=1", output), output[-3000:]
    assert latest_snapshot(run_dir) is not None, f"no final library snapshot:\n{output_tail(log)}"
