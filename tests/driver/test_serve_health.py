"""driver/serve_health.py: a library deployment that turns UNHEALTHY (Serve replacing a failed
replica) is said and counted once, its recovery said, a Serve that cannot answer skipped; the
statuses are a table stepped by hand (the real Serve is the chaos test's, tests/test_chaos.py)."""

from prometheus_client import REGISTRY

from driver.serve_health import SERVE_POLL_S, ServeHealth

FAILED = "A replica's health check failed. This deployment will be UNHEALTHY until the replica recovers or a new deploy happens."


def replica_restarts() -> float:
    return REGISTRY.get_sample_value("slea_run_component_restarts_total", {"component": "serve_replica"}) or 0.0


def test_a_failed_replica_is_said_and_counted_once_and_its_replacement_said():
    timeline = [
        {"Retrieval": ("HEALTHY", "")},
        {"Retrieval": ("UNHEALTHY", FAILED)},
        {"Retrieval": ("UNHEALTHY", FAILED)},  # still replacing: not a second failure
        RuntimeError("controller restarting"),
        {"Retrieval": ("HEALTHY", "")},
        {"Retrieval": ("HEALTHY", "")},
    ]
    asked: list[str] = []

    def statuses(app_name: str):
        asked.append(app_name)
        answer = timeline.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    now = [0.0]
    said: list[str] = []
    health = ServeHealth("slea-library", said.append, statuses, clock=lambda: now[0])
    before = replica_restarts()
    for _ in range(6):
        health.poll()
        health.poll()  # within SERVE_POLL_S: Serve is not asked again
        now[0] += SERVE_POLL_S
    assert asked == ["slea-library"] * 6 and timeline == []
    assert said == [
        f"[yellow]a Serve replica of Retrieval failed[/] ({FAILED}): Serve is replacing it",
        "Retrieval is healthy again: Serve replaced its failed replica",
    ]
    assert health.replaced == 1 and replica_restarts() - before == 1
