"""The collective weight transport's orchestration on a real local Ray with real gloo groups:
actor workers register by name through the actors' WeightSubscriber, the learner's publisher
pushes every version into each engine, and dead or stalled engines are dropped, not waited for."""

import asyncio
import sys
import time

import ray
import torch

from actors.weights_client import WeightSubscriber
from learner.weights import RayWeightPublisher
from slea.weight_group import WeightGroup, join_store, receive_weights

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import a test module


class BroadcastEngine:
    """Stands in for VllmEngine's collective side: one worker that keeps what it receives."""

    def __init__(self, stall: bool):
        self.stall = stall  # never take part in a transfer (a hung engine)
        self.policy_version, self.weight_group_size = 0, 1
        self.weights, self.group = {}, None

    async def join_weight_group(self, host, port, world_size, backend, timeout_s):
        def join():
            self.group = WeightGroup(join_store(host, port, world_size, timeout_s), 1, world_size, backend, timeout_s)

        await asyncio.to_thread(join)
        return {"dtype": "float32", "ranks": [1]}

    async def receive_weights(self, plan, version):
        if self.stall:
            await asyncio.sleep(3600)
        self.weights = dict(await asyncio.to_thread(receive_weights, self.group, plan))
        self.policy_version = version

    async def leave_weight_group(self):
        self.group.close()


@ray.remote(num_cpus=0)
class FakeActorWorker:
    """The parts of actors.pool.ActorWorkerProcess the learner talks to."""

    def __init__(self, run_id: str, label: str, stall: bool = False):
        self.engine = BroadcastEngine(stall)
        self.subscriber = WeightSubscriber(
            run_id, label, transport="collective", receiver=ray.get_runtime_context().current_actor
        )

    async def poll(self) -> bool:
        return await self.subscriber.poll(self.engine)

    async def join_weight_group(self, *args):
        return await self.engine.join_weight_group(*args)

    async def receive_weights(self, plan, version):
        await self.engine.receive_weights(plan, version)

    async def leave_weight_group(self):
        await self.engine.leave_weight_group()

    def state(self):
        return self.engine.policy_version, self.engine.weights, self.subscriber.learner_version


def _weights(value: float) -> dict:
    table = torch.full((6, 4), value)
    return {"embed.weight": table, "norm.weight": torch.arange(4.0) + value, "lm_head.weight": table}


def test_every_registered_engine_gets_the_latest_version(local_ray):
    publisher = RayWeightPublisher("push-latest", transport="collective", timeout_s=20)
    workers = [FakeActorWorker.remote("push-latest", str(index)) for index in range(2)]
    publisher.publish(1, _weights(1.0))
    publisher.flush()  # nobody registered yet: versions are announced, nothing is pushed
    assert ray.get([worker.poll.remote() for worker in workers]) == [False, False]  # registered, nothing staged
    publisher.flush()
    for worker in workers:
        version, weights, learner_version = ray.get(worker.state.remote())
        assert (version, learner_version) == (1, 1) and set(weights) == {"embed.weight", "norm.weight"}  # tied once
        torch.testing.assert_close(weights["norm.weight"], _weights(1.0)["norm.weight"])
    publisher.publish(2, _weights(2.0))
    publisher.publish(3, _weights(3.0))  # the push coalesces to the newest version
    publisher.flush()
    for worker in workers:
        version, weights, _ = ray.get(worker.state.remote())
        assert version == 3
        torch.testing.assert_close(weights["embed.weight"], torch.full((6, 4), 3.0))
    publisher.close()


def test_dead_and_stalled_engines_are_dropped_without_holding_the_others(local_ray):
    publisher = RayWeightPublisher("push-faults", transport="collective", timeout_s=3)
    healthy, doomed, stalled = (
        FakeActorWorker.remote("push-faults", label, stall=label == "stalled")
        for label in ("healthy", "doomed", "stalled")
    )
    publisher.publish(1, _weights(1.0))
    ray.get([worker.poll.remote() for worker in (healthy, doomed, stalled)])
    publisher.flush()
    assert ray.get(doomed.state.remote())[0] == 1
    ray.kill(doomed)
    started = time.monotonic()
    publisher.publish(2, _weights(2.0))
    publisher.flush()
    assert time.monotonic() - started < 30  # bounded by the timeouts, never a hang
    assert ray.get(healthy.state.remote())[0] == 2
    assert ray.get(stalled.state.remote())[0] == 0
    assert set(publisher.sender.links) == {"healthy"} and publisher.sender.failures == 2
    assert set(ray.get(publisher.registry.receivers.remote())) == {"healthy"}
    publisher.close()
