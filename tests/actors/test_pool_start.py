"""What a pool does as it is made, before any worker starts (no Ray needed)."""

import msgpack

from actors.pool import ActorPool
from slea.channels import inflight_key
from slea.config import load_config
from slea.records import decode
from slea.streams import PAYLOAD_FIELD


def test_episodes_an_earlier_driver_left_in_flight_are_marked_abandoned(redis_url, redis_client):
    """A resumed run numbers its workers from 0: a higher-numbered worker of the earlier driver has no
    successor, so the new pool marks what it left listed (else its groups would hold admission slots)."""
    config = load_config(None, ["run.id=resumed"])
    for worker, group in ((0, "g0"), (5, "g5")):
        fields = {"task_id": "t", "task_type": "x", "env_name": "e", "group_id": group, "episode_id": f"{group}-e"}
        redis_client.hset(inflight_key("resumed", worker), f"{group}-e", msgpack.packb(fields))
    redis_client.hset(inflight_key("another-run", 1), "x-e", b"left alone")

    ActorPool(config, redis_url)

    markers = [decode(fields[PAYLOAD_FIELD]) for _id, fields in redis_client.xrange(config.stream_key())]
    assert sorted((m.group_id, m.episode_id, m.abandoned) for m in markers) == [
        ("g0", "g0-e", True),
        ("g5", "g5-e", True),
    ]
    assert redis_client.keys("slea:resumed:inflight:*") == []
    assert redis_client.hgetall(inflight_key("another-run", 1)) == {b"x-e": b"left alone"}
