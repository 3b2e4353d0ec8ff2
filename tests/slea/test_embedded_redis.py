"""The embedded Redis a run starts when no `redis.url` is configured."""

import redis

from slea.embedded_redis import EmbeddedRedis


def test_a_relative_data_dir_works_and_keeps_the_aof_there(tmp_path, monkeypatch):
    """`run.dir: runs` (configs/local.yaml) gives a relative data dir; redis-server changes into
    --dir before opening its log file and AOF, so a relative path would point nowhere."""
    monkeypatch.chdir(tmp_path)
    with EmbeddedRedis("runs/r1/redis", appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        client.set("kept", "1")
        client.close()
    assert (tmp_path / "runs/r1/redis/redis.log").is_file()
    assert any((tmp_path / "runs/r1/redis").glob("appendonly*"))
