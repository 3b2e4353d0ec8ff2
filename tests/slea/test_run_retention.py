"""A finished run's keys expire from a shared Redis (redis.retention_s), and only that run's;
`slea train` sets their expiry while it lives (driver/retention.py)."""

from slea.stream_admin import expire_run, run_keys


def test_only_the_runs_own_keys_expire(redis_client):
    mine = ["slea:cluster:steps", "slea:cluster:dead", "slea:cluster:library:epoch", "slea:cluster:inflight:0"]
    others = ["slea:cluster-2:steps", "slea:clusterx:steps", "other:cluster:steps"]
    for key in mine + others:
        redis_client.set(key, b"x")
    assert sorted(run_keys(redis_client, "cluster")) == sorted(key.encode() for key in mine)
    assert expire_run(redis_client, "cluster", 3600) == 4
    assert all(0 < redis_client.ttl(key) <= 3600 for key in mine)
    assert all(redis_client.ttl(key) == -1 for key in others), "another run's keys must not expire"


def test_glob_characters_in_a_run_id_match_only_themselves(redis_client):
    redis_client.set("slea:a*b:steps", b"x")
    redis_client.set("slea:aXb:steps", b"x")
    assert run_keys(redis_client, "a*b") == [b"slea:a*b:steps"]
    assert run_keys(redis_client, "a?b") == []
