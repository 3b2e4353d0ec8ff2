"""The learner end to end: real Redis stream, real DeepSpeed (CPU, ZeRO 0), real Ray, tiny model."""

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.inflight import abandon_marker
from learner.batch import TrainSample
from learner.checkpoint import latest_checkpoint
from learner.learner import Learner
from slea.admission_counts import AdmissionCounts, read_counts
from slea.config import SleaConfig
from slea.models import tiny_model
from slea.streams import StreamProducer
from tests.learner.conftest import make_group


def config(tmp_path, run_id, **learner):
    cfg = SleaConfig()
    cfg.run.id, cfg.run.dir = run_id, str(tmp_path)
    cfg.actors.group_size = 2
    cfg.redis.block_ms = 50
    # One optimizer step per batch at a large learning rate: each test reads the direction of one update
    # (PPO mini-batches are tested in tests/learner/test_engine.py).
    settings = dict(
        tasks_per_step=1, lr=1e-2, micro_batch_tokens=64, checkpoint_every=100, group_timeout_s=60, mini_batches=1
    )
    settings.update(learner)
    for name, value in settings.items():
        setattr(cfg.learner, name, value)
    return cfg


def run_until_step(learner, polls=40):
    for _ in range(polls):
        learner.poll(block_ms=50)
        result = learner.step()
        if result is not None:
            return result
    raise AssertionError("no learner step happened")


def sum_logprobs(learner, records):
    samples = [TrainSample(r.prompt_ids, r.response_ids, r.response_logprobs, 0.0, 0) for r in records]
    return [float(values.sum()) for values in learner.trainer.logprobs(samples)]


def test_training_step_from_redis_raises_logprob_of_positive_advantage_actions(tmp_path, redis_client, local_ray):
    cfg = config(tmp_path, "raise")
    model, tokenizer = tiny_model()
    learner = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    records = make_group(learner.trainer.module, tokenizer, "g0", rewards=[1.0, 0.0])
    before = sum_logprobs(learner, records)
    time.sleep(0.5)  # the learner has had nothing to train on since it started
    StreamProducer(redis_client, cfg.stream_key()).send(records)

    result = run_until_step(learner)
    after = sum_logprobs(learner, records)

    assert result.group_ids == ["g0"] and result.metrics["policy_version"] == 1
    for record, old, new in zip(records, before, after):
        assert (new > old) == (record.episode_id == "g0-e0"), (record.episode_id, old, new)
    metrics = result.metrics
    assert metrics["steps_trained"] == 4 and metrics["staleness_histogram"] == {0: 4}
    assert metrics["anchor_group_sizes"] == {1: 2, 2: 1}  # the shared first observation
    # The first optimizer step runs at the reference's weights: KL 0, exactly in float32, up to the
    # rounding of a bf16 reference where the learner computes in bf16 (learner.reference_dtype auto;
    # CI on an AVX512-BF16 machine measured 5.4e-7).
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-5) and metrics["grad_norm"] > 0 and metrics["tokens_per_s"] > 0
    # One optimizer step, taken from the proximal weights: its ratio is 1, nothing clips, nothing has moved yet.
    assert metrics["optimizer_steps"] == 1 and metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["wait_seconds"] >= 0.5 and metrics["step_seconds"] > 0  # idle, then training: `slea bench async`
    learner.close()


def test_restart_after_consuming_before_checkpoint(tmp_path, redis_client, local_ray):
    cfg = config(tmp_path, "restart", checkpoint_every=2)
    producer = StreamProducer(redis_client, cfg.stream_key())
    model, tokenizer = tiny_model()
    first = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    versions = []
    for name in ("A", "B", "C"):  # B's step is checkpointed (every 2); C's is not
        producer.send(make_group(model, tokenizer, name, rewards=[1.0, 0.0]))
        result = run_until_step(first)
        versions.append(result.metrics["policy_version"])
    assert versions == [1, 2, 3]
    assert redis_client.xpending(cfg.stream_key(), "learner")["pending"] == 4  # C's entries
    # The actors' admission counts (actors/staleness_admission.py): 3 groups trained; an abandoned group dropped.
    listed = {"task_id": "t", "task_type": "x", "env_name": "e", "group_id": "Z", "episode_id": "Z-e0"}
    producer.send([abandon_marker(listed, cfg.run.id)])
    first.poll(block_ms=50)
    assert read_counts(redis_client, cfg.run.id) == AdmissionCounts(admitted=0, trained=3, dropped=1, version=3)
    del first  # killed: no shutdown checkpoint, no ack

    model, tokenizer = tiny_model()
    second = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    assert second.learner_step == 2  # resumed from the checkpoint of B's step
    assert second.version == 3  # 3 was published before the crash: the line continues right after it
    # C is pending again: its group counts as outstanding until it is trained anew; Z stays dropped.
    assert read_counts(redis_client, cfg.run.id) == AdmissionCounts(admitted=0, trained=2, dropped=1, version=3)
    result = run_until_step(second)
    assert result.group_ids == ["C"] and result.metrics["policy_version"] == 4  # no gap, no repeat
    assert read_counts(redis_client, cfg.run.id).trained == 3
    for _ in range(5):  # nothing else comes back: A and B were acknowledged with their checkpoint
        second.poll(block_ms=20)
        assert second.step() is None
    second.close()
    assert redis_client.xpending(cfg.stream_key(), "learner")["pending"] == 0

    saved = latest_checkpoint(tmp_path / "restart" / "learner" / "checkpoints")
    assert saved.name == "v00000004"
    reloaded = AutoModelForCausalLM.from_pretrained(saved / "hf")
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, second.trainer.module.state_dict()[name])


def test_a_learner_on_a_new_ray_cluster_never_reissues_a_version(tmp_path, redis_client, local_ray):
    """The weight registry dies with its Ray cluster; the version recorded in Redis does not. Versions
    published after the checkpoint (3 here) are carried by records in the stream, so the restarted
    learner announces its checkpoint's weights as 4 and trains on as 5."""
    import json

    import ray

    from slea.channels import RAY_NAMESPACE, policy_version_key, weight_registry_name

    cfg = config(tmp_path, "lost-cluster", checkpoint_every=2)
    producer = StreamProducer(redis_client, cfg.stream_key())
    model, tokenizer = tiny_model()
    first = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    for name in ("A", "B", "C"):  # B's step is checkpointed (every 2); C's is not
        producer.send(make_group(model, tokenizer, name, rewards=[1.0, 0.0]))
        run_until_step(first)
    first.publisher.flush()
    assert int(redis_client.get(policy_version_key(cfg.run.id))) == 3
    del first
    ray.kill(ray.get_actor(weight_registry_name(cfg.run.id), namespace=RAY_NAMESPACE))  # the cluster is gone

    model, tokenizer = tiny_model()
    second = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    second.publisher.flush()
    assert (second.learner_step, second.version) == (2, 4)  # B's checkpoint, announced after the lost 3
    assert second.publisher.latest_version() == 4 and int(redis_client.get(policy_version_key(cfg.run.id))) == 4
    result = run_until_step(second)
    assert result.group_ids == ["C"] and result.metrics["policy_version"] == 5
    second.close()
    trace = [
        json.loads(line) for line in (tmp_path / "lost-cluster/learner/trained_groups.jsonl").read_text().splitlines()
    ]
    assert [(line["learner_step"], line["policy_version"], line["group_ids"]) for line in trace] == [
        (1, 1, ["A"]),
        (2, 2, ["B"]),
        (3, 3, ["C"]),
        (2, 4, []),  # restored: the checkpoint's weights under a number of their own
        (3, 5, ["C"]),  # C's lost update, redone once from its pending entries
    ]
    assert trace[3]["restored"] is True


def test_admission_slots_no_group_holds_are_counted_lost_after_the_group_timeout(tmp_path, redis_client, local_ray):
    """Three groups counted admitted that nobody lists in flight and the stream never carried (a Redis
    that lost its last writes): after `group_timeout_s` without a ready group the learner frees them."""
    from slea.admission_counts import ADMITTED, admission_key

    cfg = config(tmp_path, "lost", group_timeout_s=1)
    model, tokenizer = tiny_model()
    learner = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    redis_client.hset(admission_key(cfg.run.id), ADMITTED, 3)
    learner.poll(block_ms=20)
    assert learner.step() is None and read_counts(redis_client, cfg.run.id).dropped == 0  # not waited long enough
    time.sleep(1.1)
    learner.poll(block_ms=20)
    assert learner.step() is None
    assert read_counts(redis_client, cfg.run.id) == AdmissionCounts(admitted=3, trained=0, dropped=3)
    assert learner.assembler.counters.groups_dropped["lost"] == 3
    learner.close()


def test_run_stops_at_max_steps_with_a_shutdown_checkpoint_and_metrics(tmp_path, redis_client, local_ray):
    cfg = config(tmp_path, "run", max_steps=1)
    model, tokenizer = tiny_model()
    StreamProducer(redis_client, cfg.stream_key()).send(make_group(model, tokenizer, "g", rewards=[0.0, 1.0]))
    learner = Learner(cfg, redis_client=redis_client, model=model, tokenizer=tokenizer)
    seen = []
    learner.run(on_metrics=seen.append)
    assert [metrics["policy_version"] for metrics in seen] == [1]
    expected = {
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "advantage_mean",
        "advantage_std",
        "episode_advantage_abs_mean",
        "step_advantage_abs_mean",
        "anchor_group_sizes",
        "tokens_per_s",
        "groups_dropped_incomplete",
        "groups_dropped_abandoned",
        "groups_dropped_stale",
        "groups_dropped_lost",
        "staleness_histogram",
    }
    assert expected <= set(seen[0])
    run_dir = tmp_path / "run" / "learner"
    assert latest_checkpoint(run_dir / "checkpoints").name == "v00000001"  # the shutdown checkpoint
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    assert redis_client.xpending(cfg.stream_key(), "learner")["pending"] == 0


def test_anchor_keys_are_exact_observations_or_library_clusters():
    from learner.learner import anchor_keys
    from slea.records import StepRecord

    rows = [
        StepRecord("r", "t", "k", "alfworld", "g", "e0", 0, "You arrive at countertop 1.", anchor_cluster="c7"),
        StepRecord("r", "t", "k", "alfworld", "g", "e1", 0, "You arrive at countertop 2.", anchor_cluster="c7"),
        StepRecord("r", "t", "k", "alfworld", "g", "e2", 0, "You arrive at countertop 1."),
    ]
    assert anchor_keys(rows, "exact") == [
        "obs:You arrive at countertop 1.",
        "obs:You arrive at countertop 2.",
        "obs:You arrive at countertop 1.",
    ]
    # the two countertop states share a library cluster; the row retrieved for nothing keeps its text
    assert anchor_keys(rows, "cluster") == ["cluster:c7", "cluster:c7", "obs:You arrive at countertop 1."]
