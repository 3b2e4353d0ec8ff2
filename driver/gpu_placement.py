"""Whether the Ray cluster has the GPUs a run asks for, checked before anything waits on them.

A Ray actor that asks for more GPUs than any node can give is not an error to Ray: it waits,
silently, for a node that may never come (`slea train` would show "loading the learner" for
ever). So the driver packs the run's GPU requests (learner ranks, actor workers, the evaluator)
onto the cluster's GPUs the way Ray places them (a fractional request shares one GPU with
others whose fractions fit in it; a request of n >= 1 takes n whole GPUs of one node) and
names what does not fit. On a local Ray that is an error; on a cluster (an autoscaler may add
GPU nodes) it is a warning.
"""

from __future__ import annotations

import math

from slea.config import SleaConfig


def gpu_requests(config: SleaConfig) -> list[tuple[str, float]]:
    """(who, GPUs) of every Ray actor the run starts that asks for GPUs."""
    requests = [(f"learner rank {rank}", config.learner.num_gpus) for rank in range(config.learner.num_ranks)]
    requests += [(f"actor worker {index}", config.actors.num_gpus) for index in range(config.actors.num_workers)]
    if config.eval.every > 0:
        requests.append(("evaluator", config.eval.num_gpus))
    return [(who, gpus) for who, gpus in requests if gpus > 0]


def unplaceable(requests: list[tuple[str, float]], gpus_per_node: list[float]) -> list[str]:
    """The requests that do not fit on nodes with these GPU counts (first fit, largest first;
    capacities in hundredths so that 0.45 + 0.55 fills a GPU exactly)."""
    free = [[100] * int(count) for count in gpus_per_node]  # per node, per GPU: hundredths still free
    left = []
    for who, gpus in sorted(requests, key=lambda request: -request[1]):
        need = round(gpus * 100)
        placed = False
        for node in free:
            if need >= 100:
                whole = [index for index, room in enumerate(node) if room == 100]
                if len(whole) >= math.ceil(need / 100):
                    for index in whole[: math.ceil(need / 100)]:
                        node[index] = 0
                    placed = True
            else:
                index = next((index for index, room in enumerate(node) if room >= need), None)
                if index is not None:
                    node[index] -= need
                    placed = True
            if placed:
                break
        if not placed:
            left.append(f"{who} ({gpus:g} GPU)")
    return left


def gpu_shortfall(config: SleaConfig, gpus_per_node: list[float]) -> str | None:
    """What the cluster cannot place, in words, or None when every GPU request fits."""
    left = unplaceable(gpu_requests(config), gpus_per_node)
    if not left:
        return None
    total = sum(gpus for _who, gpus in gpu_requests(config))
    return (
        f"the run asks for {total:g} GPUs (learner.num_gpus x learner.num_ranks, actors.num_gpus x "
        f"actors.num_workers, eval.num_gpus) and the Ray cluster's nodes have {[int(n) for n in gpus_per_node]} "
        f"GPUs: nothing would place {', '.join(left)}, and Ray would wait for them for ever. Lower the "
        "num_gpus settings, or run where the GPUs are (ray.address)"
    )


def cluster_gpus_per_node() -> list[float]:
    """GPUs of every live node of the connected Ray cluster."""
    import ray

    return [node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node.get("Alive")]
