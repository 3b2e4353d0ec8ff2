"""The learner's admission counts (learner/admission_report.py) against a real Redis, and its count of
lost slots."""

import msgpack

from learner.admission_report import AdmissionReport
from slea.admission_counts import ADMITTED, AdmissionCounts, admission_key, read_counts
from slea.channels import inflight_key
from slea.streams import StreamProducer, ensure_group

STREAM = "slea:r:steps"


def list_in_flight(client, worker: int, group_id: str) -> None:
    fields = {"group_id": group_id, "episode_id": f"{group_id}-0"}
    client.hset(inflight_key("r", worker), f"{group_id}-0", msgpack.packb(fields))


def test_trained_is_a_total_and_dropped_adds_up(redis_client):
    report = AdmissionReport(redis_client, "r", reconnect_max_s=1)
    report.trained(4, version=2)
    report.dropped(2)
    report.dropped(0)
    report.dropped(1)
    report.trained(2, version=3)  # a learner restarted from an earlier checkpoint rolls its total back
    assert read_counts(redis_client, "r") == AdmissionCounts(admitted=0, trained=2, dropped=3, version=3)


def test_lost_slots_are_those_no_worker_lists_and_the_learner_does_not_hold(redis_client):
    ensure_group(redis_client, STREAM, "learner")
    report = AdmissionReport(redis_client, "r", reconnect_max_s=1)
    redis_client.hset(admission_key("r"), ADMITTED, 7)
    report.trained(2, version=1)
    report.dropped(1)  # 4 outstanding
    list_in_flight(redis_client, 0, "a")
    list_in_flight(redis_client, 3, "b")  # a worker of an earlier pool size
    assert report.lost_groups({"c"}, STREAM, "learner") == 1  # a, b in flight, c held: one slot lost
    assert report.lost_groups({"c", "d", "e"}, STREAM, "learner") == 0  # never below zero


def test_no_slot_is_lost_while_the_stream_holds_entries_the_learner_has_not_read(redis_client):
    ensure_group(redis_client, STREAM, "learner")
    report = AdmissionReport(redis_client, "r", reconnect_max_s=1)
    redis_client.hset(admission_key("r"), ADMITTED, 3)
    from actors.inflight import abandon_marker

    listed = {"task_id": "t", "task_type": "x", "env_name": "e", "group_id": "g", "episode_id": "g-0"}
    StreamProducer(redis_client, STREAM).send([abandon_marker(listed, "r")])
    assert report.lost_groups(set(), STREAM, "learner") == 0
