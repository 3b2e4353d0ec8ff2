"""A run's keys in a shared Redis carry an expiry that a live driver refreshes (driver/retention.py):
a driver killed with SIGKILL (an evicted head pod: no `finally` runs) leaves keys that go
`redis.retention_s` after its last refresh, while a live driver's keys outlast that time."""

import subprocess
import sys
import time

from slea.channels import CURRENT_LIBRARY_RUN_KEY

DRIVER = """
import sys, time
from rich.console import Console
from driver.progress import RunConsole
from driver.retention import retained
from slea.config import load_config

config = load_config(None, [f"redis.url={sys.argv[1]}", "run.id=killed", "redis.retention_s=2"])
with retained(config, RunConsole(Console(stderr=True))):
    print("ready", flush=True)
    time.sleep(600)
"""


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_killed_drivers_keys_expire_after_the_retention_time_and_a_live_ones_stay(redis_client, redis_url):
    before = ["slea:killed:policy_version", "slea:killed:steps"]
    redis_client.set(before[0], 3)
    redis_client.xadd(before[1], {"r": b"x"})
    redis_client.set(CURRENT_LIBRARY_RUN_KEY, "killed")
    redis_client.set("slea:other:steps", b"x")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, redis_url], stdout=subprocess.PIPE)
    try:
        assert driver.stdout.readline() == b"ready\n"
        redis_client.hset("slea:killed:inflight:0", "episode", b"x")  # a key created while the driver runs
        run_keys = [*before, "slea:killed:inflight:0", CURRENT_LIBRARY_RUN_KEY]
        assert wait_until(lambda: all(redis_client.ttl(key) > 0 for key in run_keys), 5), [
            redis_client.ttl(key) for key in run_keys
        ]
        time.sleep(3)  # past the retention time: the live driver keeps refreshing
        assert redis_client.exists(*run_keys) == len(run_keys)
    finally:
        driver.kill()
        driver.wait()
    assert wait_until(lambda: redis_client.exists(*run_keys) == 0, 5), "a killed driver's keys stayed"
    assert redis_client.ttl("slea:other:steps") == -1, "another run's keys are not this driver's"


def test_the_current_library_run_is_refreshed_only_while_it_names_this_run(redis_client, redis_url):
    redis_client.set(CURRENT_LIBRARY_RUN_KEY, "newer")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, redis_url], stdout=subprocess.PIPE)
    try:
        assert driver.stdout.readline() == b"ready\n"
        time.sleep(1)
        assert redis_client.ttl(CURRENT_LIBRARY_RUN_KEY) == -1, "another run's pointer got this run's expiry"
    finally:
        driver.kill()
        driver.wait()
