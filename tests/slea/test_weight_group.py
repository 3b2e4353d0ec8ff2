"""The weight-transfer group on gloo (the CPU stand-in for NCCL): plans, a real broadcast between
two ranks (threads), and timeouts instead of hangs."""

import threading
import time

import pytest
import torch

from slea.weight_group import WeightGroup, host_store, join_store, plan_buckets, receive_weights, send_weights


def test_plan_sends_tied_weights_once_and_splits_by_size_and_dtype():
    table = torch.zeros(4, 8)  # 128 bytes in float32
    state = {
        "embed.weight": table,
        "norm.weight": torch.zeros(8),
        "lm_head.weight": table,
        "big.weight": torch.zeros(64),
        "steps": torch.zeros(2, dtype=torch.int64),
    }
    plan = plan_buckets(state, bucket_bytes=160)
    assert plan == [
        {"dtype": "float32", "tensors": [["embed.weight", [4, 8]], ["norm.weight", [8]]]},  # 128 + 32 bytes
        {"dtype": "float32", "tensors": [["big.weight", [64]]]},  # 256 bytes: over the budget, alone
        {"dtype": "int64", "tensors": [["steps", [2]]]},
    ]
    assert [bucket["dtype"] for bucket in plan_buckets(state, torch.bfloat16)] == ["bfloat16"]  # the engine's dtype


def _pair(timeout_s: float):
    """Rank 0 and rank 1 of one group, built at once (each blocks until the other joins)."""
    store = host_store("127.0.0.1", 2, timeout_s)
    groups = {}
    joiner = threading.Thread(
        target=lambda: groups.setdefault(
            1, WeightGroup(join_store("127.0.0.1", store.port, 2, timeout_s), 1, 2, "gloo", timeout_s)
        )
    )
    joiner.start()
    groups[0] = WeightGroup(store, 0, 2, "gloo", timeout_s)
    joiner.join()
    return groups[0], groups[1]


def test_broadcast_round_trip_in_the_receivers_dtype():
    generator = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(3, 5, generator=generator), "b": torch.randn(7, generator=generator)}
    state["tied"] = state["a"]
    plan = plan_buckets(state, torch.bfloat16, bucket_bytes=32)
    sender, receiver = _pair(timeout_s=30)
    received = {}
    thread = threading.Thread(target=lambda: received.update(receive_weights(receiver, plan)))
    thread.start()
    send_weights(sender, state, plan)
    thread.join()
    assert set(received) == {"a", "b"}
    for name in received:
        assert received[name].dtype == torch.bfloat16
        torch.testing.assert_close(received[name], state[name].to(torch.bfloat16))
    sender.close(), receiver.close()


def test_a_receiver_that_never_joins_or_never_receives_costs_the_timeout_not_a_hang():
    started = time.monotonic()
    with pytest.raises(Exception, match="timeout"):
        WeightGroup(host_store("127.0.0.1", 2, 2), 0, 2, "gloo", timeout_s=2)
    sender, receiver = _pair(timeout_s=2)
    with pytest.raises(RuntimeError, match="(?i)timed out"):  # torch says "timed out", gloo "Timed out"
        send_weights(sender, {"w": torch.zeros(4_000_000)}, plan_buckets({"w": torch.zeros(4_000_000)}))
    assert time.monotonic() - started < 15
    sender.close(), receiver.close()


def test_the_join_waits_for_every_rank_to_warm_up_and_times_out_without_it():
    """A peer that is in the store and the process group but never takes the warm-up broadcast
    (died right after joining) fails the join itself, within the timeout: the first weight push
    is never the first collective of a link."""
    from datetime import timedelta

    import torch.distributed as dist

    store = host_store("127.0.0.1", 2, 2)
    peer = {}

    def join_without_warm_up():
        prefixed = dist.PrefixStore("slea-weights", join_store("127.0.0.1", store.port, 2, 2))
        peer["group"] = dist.ProcessGroupGloo(prefixed, 1, 2, timedelta(seconds=2))

    thread = threading.Thread(target=join_without_warm_up)
    thread.start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="[Tt]imed out"):
        WeightGroup(store, 0, 2, "gloo", timeout_s=2)
    assert time.monotonic() - started < 15
    thread.join()


def test_a_dropped_link_is_aborted_at_once_and_cpu_groups_have_no_stream():
    sender, receiver = _pair(timeout_s=2)
    assert sender.stream is None and receiver.stream is None  # a CUDA stream only for a GPU sender
    with pytest.raises(RuntimeError, match="(?i)timed out"):  # torch says "timed out", gloo "Timed out"
        send_weights(sender, {"w": torch.zeros(1000)}, plan_buckets({"w": torch.zeros(1000)}))
    started = time.monotonic()
    sender.close(abort=True)
    assert time.monotonic() - started < 5 and sender._group is None
    receiver.close()
