"""`slea train`'s metrics line, from a learner step, the stream lags and the actor workers' summaries;
one poll of the driver's loop (Watch.step) with a real Redis stream and fakes of the Ray-side pool."""

import io
import json
import threading

import pytest
from rich.console import Console

from driver.progress import Progress, RunConsole
from driver.run_outputs import RunRecorder
from driver.train import Watch, create_stream_groups, run_metrics
from slea.config import load_config
from slea.embedded_redis import EmbeddedRedis
from slea.records import StepRecord
from slea.redis_conn import connect
from slea.services import STREAM_GROUPS
from slea.streams import StreamConsumer, StreamProducer, ensure_group


def test_a_line_sums_the_workers_busy_and_throttled_seconds_and_their_tokens_by_engine():
    learner = {
        "learner_step": 3,
        "loss": 0.5,
        "staleness_histogram": {0: 4, 1: 2},
        "episodes/pick/episodes": 4,
        "episodes/pick/successes": 1,
        "episode_length_mean": 3.5,
    }
    pool = [
        {"busy_s": 2.5, "throttled_s": 1.0, "engine": "vllm", "timers": {"tokens": 30}},
        {"busy_s": 4.0, "throttled_s": 0.25, "engine": "vllm", "timers": {"tokens": 12}},
    ]
    line = run_metrics(learner, {"learner": 7}, None, pool)
    assert line == {
        "learner/learner_step": 3,
        "learner/loss": 0.5,
        "learner/staleness_histogram/0": 4,
        "learner/staleness_histogram/1": 2,
        "learner/episode_length_mean": 3.5,
        "actors/success_rate/pick": 0.25,
        "actors/success_rate": 0.25,
        "actors/episode_length": 3.5,
        "stream/lag/learner": 7,
        "actors/busy_s": 6.5,
        "actors/throttled_s": 1.25,
        "actors/tokens/vllm": 42,
    }
    assert "actors/busy_s" not in run_metrics(learner, {}, None)  # the shutdown drain has no summaries


class FakePool:
    """The ActorPool's side the driver's poll uses: supervision and the workers' summaries."""

    def __init__(self, summaries: list[dict], restarts: list[list[tuple[int, str]]] = ()):
        self.supervised = 0
        self._summaries = summaries
        self._restarts = list(restarts)  # what each supervise() reports, then nothing

    def supervise(self) -> list[tuple[int, str]]:
        self.supervised += 1
        return self._restarts.pop(0) if self._restarts else []

    def summaries(self) -> list[dict]:
        return self._summaries


class FakeSizer:
    """PoolSizer's poll side (its RunControl actor needs Ray): what each update saw."""

    def __init__(self):
        self.updates: list[tuple[list[dict], list[dict]]] = []

    def update(self, summaries: list[dict], learner_steps: list[dict]) -> None:
        self.updates.append((summaries, learner_steps))


def quiet_watch(config, client, recorder) -> Watch:
    """A Watch with no pool, learner or library behind it, logging to nowhere: its stream side alone."""
    return Watch(
        config,
        client,
        FakePool([]),
        FakeSizer(),
        drain_learner=list,
        library_stats=lambda: None,
        progress=Progress(config),
        recorder=recorder,
        console=RunConsole(Console(file=io.StringIO(), force_terminal=False)),
    )


def test_one_poll_records_every_drained_learner_step_and_trims_what_both_groups_acked(tmp_path, redis_client):
    config = load_config(None, ["run.id=watch", "monitoring.plots=false"])
    stream = config.stream_key()
    for group in STREAM_GROUPS:
        ensure_group(redis_client, stream, group)
    for index in range(5):
        redis_client.xadd(stream, {"payload": str(index)})
    read = {  # the learner has had all 5 entries and acknowledged 3, the library has had 2, both acked
        group: [
            entry_id
            for _s, entries in redis_client.xreadgroup(group, "c", {stream: ">"}, count=count)
            for entry_id, _ in entries
        ]
        for group, count in (("learner", 5), ("library", 2))
    }
    redis_client.xack(stream, "learner", *read["learner"][:3])
    redis_client.xack(stream, "library", *read["library"])
    worker = {"worker": 0, "busy_s": 3.0, "throttled_s": 0.5, "engine": "transformers", "episodes_finished": 4}
    worker["timers"] = {"tokens": 40, "steps": 6, "strategy_steps": 1, "warning_steps": 0}
    pool, sizer = FakePool([worker]), FakeSizer()
    drained = [
        [{"learner_step": 1, "policy_version": 1, "loss": 0.5}, {"learner_step": 2, "policy_version": 2, "loss": 0.25}],
        [],
    ]
    output = io.StringIO()
    console = RunConsole(Console(file=output, force_terminal=False, width=200))  # a log: one line per step
    recorder = RunRecorder(tmp_path, plots=False)
    watch = Watch(
        config,
        redis_client,
        pool,
        sizer,
        drain_learner=lambda: drained.pop(0),
        library_stats=lambda: {
            "version": 7,
            "experiences": {"strategy/principle": 2, "warning/mistake": 1},
            "prompts": {"seen": 12, "strategy": 5, "warning": 2},
        },
        progress=Progress(config),
        recorder=recorder,
        console=console,
    )

    assert [step["learner_step"] for step in watch.step()] == [1, 2]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2] and lines[1]["learner/loss"] == 0.25
    assert lines[0]["stream/lag/learner"] == 0 and lines[0]["stream/lag/library"] == 3  # undelivered entries
    assert lines[0]["library/version"] == 7 and lines[0]["library/size/strategy"] == 2
    assert (lines[0]["library/prompts/seen"], lines[0]["library/prompts/strategy"]) == (12, 5)
    assert lines[0]["actors/busy_s"] == 3.0 and lines[0]["actors/tokens/transformers"] == 40
    assert redis_client.xlen(stream) == 3, "the two entries both groups acknowledged are trimmed, nothing else"
    assert pool.supervised == 1 and len(sizer.updates) == 1  # `slea scale` and the autoscaler see the poll
    assert sizer.updates[0][0] == [worker] and [step["learner_step"] for step in sizer.updates[0][1]] == [1, 2]
    logged = output.getvalue()
    assert "step 1/100 version 1" in logged and "step 2/100 version 2" in logged

    assert watch.step() == [] and pool.supervised == 2  # a poll with no learner step records nothing
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2 and watch.stats["version"] == 7
    recorder.close()


def test_a_worker_ray_restarted_is_said_and_counted_once(tmp_path, redis_client):
    """The pool reports a worker whose process Ray restarted (actors/pool.py); the driver's poll puts
    it in the run's log and in slea_run_component_restarts_total{component="actor_worker"}."""
    from prometheus_client import REGISTRY

    from actors.pool import PROCESS_RESTARTED

    def restarts() -> float:
        return REGISTRY.get_sample_value("slea_run_component_restarts_total", {"component": "actor_worker"}) or 0.0

    config = load_config(None, ["run.id=worker-restart", "monitoring.plots=false"])
    for group in STREAM_GROUPS:
        ensure_group(redis_client, config.stream_key(), group)
    output = io.StringIO()
    recorder = RunRecorder(tmp_path, plots=False)
    watch = Watch(
        config,
        redis_client,
        FakePool([], restarts=[[(1, PROCESS_RESTARTED)]]),
        FakeSizer(),
        drain_learner=list,
        library_stats=lambda: None,
        progress=Progress(config),
        recorder=recorder,
        console=RunConsole(Console(file=output, force_terminal=False, width=200)),
    )
    before = restarts()
    watch.step()
    watch.step()
    assert restarts() - before == 1
    assert output.getvalue().count("actor worker 1 restarted (Ray restarted its process after it died)") == 1
    recorder.close()


def test_a_poll_rides_out_a_redis_restart_on_its_aof(tmp_path):
    """Redis restarting (a pod rescheduled, the chaos test's fault) must not end the run: the poll's
    lag and trim wait for it within redis.reconnect_max_s."""
    server = EmbeddedRedis(tmp_path / "redis", appendonly=True).start()
    config = load_config(None, ["run.id=outage", "monitoring.plots=false", f"redis.url={server.url}"])
    client = connect(config.redis)
    try:
        for group in STREAM_GROUPS:
            ensure_group(client, config.stream_key(), group)
        client.xadd(config.stream_key(), {"payload": "0"})
        recorder = RunRecorder(tmp_path, plots=False)
        watch = quiet_watch(config, client, recorder)
        server.stop(remove_data=False)
        restart = threading.Timer(1.5, server.start)
        restart.start()
        assert watch.step() == []  # would raise ConnectionError without the retry
        restart.join()
        assert client.xlen(config.stream_key()) == 1  # the entry came back from the AOF
        recorder.close()
    finally:
        client.close()
        server.stop()


@pytest.mark.parametrize("preset", ["grpo", "slea", "task_retrieval"])
def test_the_stream_stays_bounded_in_every_preset(tmp_path, redis_client, preset):
    """The driver creates the run's groups, the components the preset runs read and ack every entry
    (the learner always, the library writer only with a library), and every poll trims: XLEN stays
    at most one round's entries. A group nobody reads (a grpo run's `library`) would keep them all."""
    config = load_config(None, ["run.id=bounded", f"run.preset={preset}", "monitoring.plots=false"])
    stream = config.stream_key()
    create_stream_groups(redis_client, config)
    readers = [
        StreamConsumer(
            redis_client, stream, group=group, consumer=f"{group}-0", dead_letter_key=config.dead_letter_key()
        )
        for group in ["learner"] + (["library"] if config.library.enabled else [])
    ]
    producer = StreamProducer(redis_client, stream)
    recorder = RunRecorder(tmp_path, plots=False)
    watch = quiet_watch(config, redis_client, recorder)
    lengths = []
    for round_index in range(5):
        producer.send(
            [StepRecord("bounded", "t", "pick", "alfworld", "g", f"e{round_index}", step, "obs") for step in range(20)]
        )
        for reader in readers:
            reader.ack([delivery.entry_id for delivery in reader.read(count=100, block_ms=10)])
        watch.step()
        lengths.append(redis_client.xlen(stream))
    recorder.close()
    assert lengths == [0] * 5, f"{preset}: XLEN after each poll {lengths}, with every entry acknowledged by its readers"


def test_the_driver_names_the_groups_it_does_not_read(redis_client):
    """A group the run does not read (an operator's, or the `library` group an older slea made for a
    grpo run) keeps the stream from being trimmed: the driver says so at the start."""
    config = load_config(None, ["run.id=unread", "run.preset=grpo"])
    assert create_stream_groups(redis_client, config) == []
    assert [group["name"] for group in redis_client.xinfo_groups(config.stream_key())] == [b"learner"]
    redis_client.xgroup_create(config.stream_key(), "library", id="0")
    assert create_stream_groups(redis_client, config) == ["library"]


@pytest.mark.slow  # starts a local Ray
def test_a_sigterm_after_joining_ray_starts_the_graceful_stop(tmp_path, monkeypatch):
    """The driver's SIGTERM (a pod's preStop hook, KubeRay's StopJob through Ray's job supervisor)
    must raise KeyboardInterrupt, the graceful stop. ray.init() installs its own SIGTERM handler
    over the one `slea train` set before: before the driver put its own back, the SIGTERM exited
    the process at once (SystemExit here; in a Ray job's driver an abort, exit 134), and the
    deployment test found no checkpoint after the head pod's deletion."""
    import os
    import signal

    import ray

    from driver.train import _join_ray
    from monitoring import ray_metrics
    from slea.services import sigterm_as_interrupt

    # _join_ray chooses Ray's metrics for this process; undone after the test, or every later test in
    # this pytest worker would find its metrics sent to a Ray that is gone (prometheus_client's REGISTRY empty)
    monkeypatch.setattr(ray_metrics, "_chosen", False)
    monkeypatch.setattr(ray_metrics, "_worker_mode", None)

    config = load_config(None, [f"run.dir={tmp_path}", "ray.num_cpus=1", "monitoring.metrics_port=null"])
    console = RunConsole(Console(file=io.StringIO(), force_terminal=False))
    try:
        with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
            _join_ray(config, console)
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(5)
    finally:
        ray.shutdown()
