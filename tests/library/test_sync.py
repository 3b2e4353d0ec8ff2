"""The writer's side of library/sync.py with a real Redis: `slea:current_library_run` only moves
forward (to a run whose library started later), and the writer's overwrites keep the run's expiry."""

import time

from library.sync import Publisher, epoch_key, snapshot_key
from slea.channels import CURRENT_LIBRARY_RUN_KEY
from slea.stream_admin import expire_run, run_keys


def test_an_older_runs_writer_cannot_take_the_current_run_back(redis_client):
    Publisher(redis_client, "older").start("older v1")
    time.sleep(0.01)
    Publisher(redis_client, "newer").start("newer v1")
    assert redis_client.get(CURRENT_LIBRARY_RUN_KEY) == b"newer"
    Publisher(redis_client, "older").start("older v2")  # the older run's writer restarts
    assert redis_client.get(CURRENT_LIBRARY_RUN_KEY) == b"newer", "a RayService would switch to the older run"
    assert redis_client.get(snapshot_key("older")) == b"older v2", "its own library is still published"
    Publisher(redis_client, "newer").start("newer v2")  # the current run's writer restarts: it keeps it
    assert redis_client.get(CURRENT_LIBRARY_RUN_KEY) == b"newer"


def test_a_current_run_whose_keys_expired_gives_way(redis_client):
    Publisher(redis_client, "older").start("older v1")
    time.sleep(0.01)
    Publisher(redis_client, "newer").start("newer v1")
    redis_client.delete(*run_keys(redis_client, "newer"))  # its retention ran out
    Publisher(redis_client, "older").start("older v2")
    assert redis_client.get(CURRENT_LIBRARY_RUN_KEY) == b"older"


def test_the_writers_overwrites_keep_the_runs_expiry(redis_client):
    """The driver refreshes the expiry of the run's keys (driver/retention.py); a SET between two
    refreshes must not take it off (a SIGKILLed driver would leave that key for ever)."""
    publisher = Publisher(redis_client, "kept")
    publisher.start("v1")
    expire_run(redis_client, "kept", 3600)
    publisher.publish_snapshot("v2")
    Publisher(redis_client, "kept").start("v3")  # a writer restart
    assert all(0 < redis_client.ttl(key) <= 3600 for key in (snapshot_key("kept"), epoch_key("kept")))
