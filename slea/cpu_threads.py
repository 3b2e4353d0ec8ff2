"""Each Ray actor computes on the CPUs Ray gave it, no more.

torch starts one intra-op thread per physical core in every process. The learner, each actor
worker, the evaluator and the library's embedder all run at once in `slea train`, so on a
2-core machine that is 2 threads each on 2 cores: OpenMP threads that spin while they wait
and steal time from each other, and the actor-learner overlap buys little. Sizing each
process's thread pool to its Ray `num_cpus` (at least 1) gives every component its own cores,
as it would have its own GPU.

The synchronous baseline (`actors.synchronous`, `slea bench async`) is the exception: there the
learner and the actors take turns and never compute at once, so each keeps every core of the
machine. A synchronous trainer gives each phase the whole machine (verl-agent runs rollout and
training on the same devices, one after the other); at one thread each, every phase would leave
the other cores idle, a handicap only the baseline would pay.

Threads that wait sleep (`worker_environment`: OMP_WAIT_POLICY=PASSIVE in every Ray worker of a
run). torch's libgomp otherwise spins a waiting thread for ~300k iterations before it sleeps: alone
that buys nothing measurable, but with the learner's two threads and an actor's one on two cores the
spinning threads take the cores the other process needs. `slea bench cores` measured both, and
splitting the cores instead (BENCHMARKS.md, "Sharing the cores").
"""

from __future__ import annotations

import math
import os

import torch

WAIT_POLICY = "OMP_WAIT_POLICY"  # libgomp (torch's OpenMP) reads it once, when the library loads


def worker_environment() -> dict[str, str]:
    """Environment variables for every Ray worker of a run (`ray.init(runtime_env={"env_vars": ...})`):
    waiting OpenMP threads sleep instead of spinning, unless the user's own environment says otherwise.
    It must be set before the worker imports torch, so a runtime env, not `os.environ` in the actor."""
    return {WAIT_POLICY: os.environ.get(WAIT_POLICY, "PASSIVE")}


def use_assigned_cpus(phases_alternate: bool = False) -> int:
    """Inside a Ray actor: size torch's thread pool to the actor's CPUs, or with `phases_alternate`
    (the synchronous baseline) to every CPU this process may run on; returns the thread count."""
    import ray

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
    threads = len(os.sched_getaffinity(0)) if phases_alternate else max(1, math.floor(cpus))
    torch.set_num_threads(threads)
    return threads
