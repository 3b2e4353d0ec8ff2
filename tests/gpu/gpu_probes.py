"""The GPU tier's probes, each run in a subprocess of its own by tests/gpu/test_gpu_path.py (vLLM
changes its process's environment, and a CUDA context or an NCCL communicator does not come back
from a failure cleanly). Each writes what it measured as JSON to the file it is given (vLLM logs
to stdout: a result there would be lost among its lines); the test checks it.

usage: python gpu_probes.py NAME RESULT.json [ARGS...]
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "actors" / "engines"))  # vllm_prefix_cache_probe

import numpy as np  # noqa: E402
import torch  # noqa: E402


def _engine(checkpoint: str, dtype: str, utilisation: float, max_new_tokens: int = 32):
    from actors.engines.base import SamplingSettings
    from actors.engines.vllm_engine import VllmEngine

    return VllmEngine(
        checkpoint,
        SamplingSettings(temperature=1.0, max_new_tokens=max_new_tokens),
        dtype=dtype,
        engine_args={"gpu_memory_utilization": utilisation, "max_model_len": 2048},
    )


def _prompts(tokenizer, count: int) -> list[list[int]]:
    texts = [f"You are in room {i}. Your task is to: put a mug in the sink." for i in range(count)]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for t in texts
    ]


def one_vllm_process(checkpoint: str, weights: str) -> dict:
    """Every vLLM check on one engine start (float32, so that the test can hold the swapped-in
    weights' log-probs to transformers' closely): which model runner vLLM took, finite log-probs
    and decode tokens/s at batch 16; then other weights through the object-store path (staging,
    in-place reload under CUDA graphs) and 4 generations with them, saved for the test to score
    with transformers; then the prefix cache reset while a request holds KV blocks."""
    from safetensors.torch import load_file
    from vllm_prefix_cache_probe import prefix_cache_reset

    engine = _engine(checkpoint, "float32", 0.3, max_new_tokens=128)
    config = engine._engine.vllm_config
    prompts = _prompts(engine.tokenizer, 16)
    engine.generate_batch(prompts[:2])  # warm-up (CUDA graphs, compilation caches)
    start = time.perf_counter()
    generations = engine.generate_batch(prompts)
    seconds = time.perf_counter() - start

    async def swap_and_generate():  # in a loop of its own, as an actor's next round asks
        engine.update_weights(load_file(weights), version=1)
        return await asyncio.gather(*(engine.generate(p) for p in prompts[:4]))

    updated = asyncio.run(swap_and_generate())
    prefix_cache = prefix_cache_reset(engine)
    engine.close()
    return {
        "v2_model_runner": bool(config.use_v2_model_runner),
        "enforce_eager": bool(config.model_config.enforce_eager),
        "finite_logprobs": all(bool(torch.isfinite(torch.as_tensor(g.logprobs)).all()) for g in generations),
        "tokens": sum(len(g.response_ids) for g in generations),
        "tokens_per_s": sum(len(g.response_ids) for g in generations) / seconds,
        "versions": [g.policy_version for g in updated],
        "generations": [
            {"prompt_ids": g.prompt_ids, "response_ids": g.response_ids.tolist(), "logprobs": g.logprobs.tolist()}
            for g in updated
        ],
        "prefix_cache": prefix_cache,
    }


def counted_gb(trainer, tokens: int, responses: int) -> float:
    """learner/memory.py's count for `trainer`'s settings and the micro-batch it trained (`tokens`
    padded tokens, `responses` of them response positions): the floor its measured peak is checked
    against."""
    from learner.memory import count_for

    trained = trainer.cfg.model_copy(update={"micro_batch_tokens": tokens})
    memory = count_for(
        trainer.module, trained, world_size=trainer.world_size, compute_dtype=trainer.compute_dtype,
        response_tokens=responses,
    )  # fmt: skip
    return memory.total / 2**30


def zero2_bf16_step(checkpoint: str) -> dict:
    """One ZeRO-2 learner batch computing in bf16 on the GPU: dtypes of the module (float32: the
    masters), ZeRO's partitions and the optimizer state, the loss, the behaviour/proximal log-ratio
    and the peak memory."""
    from learner.batch import TrainSample
    from learner.engine import PolicyTrainer
    from slea.config import LearnerConfig
    from slea.models import load_model

    model, tokenizer = load_model(checkpoint)
    cfg = LearnerConfig(zero_stage=2, num_gpus=1.0, mini_batches=2, compute_dtype="bfloat16")
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id)
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(8):
        prompt = torch.randint(0, model.config.vocab_size, (96,), generator=generator).numpy()
        response = torch.randint(0, model.config.vocab_size, (32,), generator=generator).numpy()
        samples.append(TrainSample(prompt, response, np.zeros(32, dtype=np.float32), float(i % 2) - 0.5, 0))
    behaviour = trainer.logprobs(samples)  # the learner's own log-probs stand in for the actor's
    samples = [
        TrainSample(s.prompt_ids, s.response_ids, b.float().numpy(), s.advantage, 0) for s, b in zip(samples, behaviour)
    ]
    torch.cuda.reset_peak_memory_stats()
    stats = trainer.train_step(samples)
    optimizer = trainer.optimizer
    masters = getattr(optimizer, "single_partition_of_fp32_groups", None) or [
        p for group in optimizer.param_groups for p in group["params"]
    ]
    state_dtypes = sorted(
        {str(v.dtype) for state in optimizer.optimizer.state.values() for v in state.values() if torch.is_tensor(v)}
    )
    return {
        "device": str(trainer.device),
        "compute_dtype": str(trainer.compute_dtype),
        "module_dtype": str(next(trainer.module.parameters()).dtype),
        "master_dtypes": sorted({str(p.dtype) for p in masters}),
        "optimizer_state_dtypes": state_dtypes,
        "optimizer": type(optimizer).__name__,
        "loss": stats.loss,
        "finite": math.isfinite(stats.loss) and math.isfinite(stats.grad_norm),
        "behav_weight": stats.behav_weight,
        "behav_masked_fraction": stats.behav_masked_fraction,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
        "counted_gb": counted_gb(trainer, tokens=4 * 128, responses=4 * 32),  # a mini-batch: 4 rows, one micro-batch
    }


def shared_gpu(checkpoint: str) -> dict:
    """vLLM (0.45 of the GPU, reserved at start) and a learner capped at 0.5 in one process's GPU:
    a learner batch and a generation after it both complete."""
    from learner.batch import TrainSample
    from learner.engine import PolicyTrainer
    from slea.config import LearnerConfig
    from slea.models import load_model

    engine = _engine(checkpoint, "bfloat16", 0.45)
    model, tokenizer = load_model(checkpoint)
    cfg = LearnerConfig(zero_stage=2, num_gpus=0.5, mini_batches=1, compute_dtype="bfloat16")
    trainer = PolicyTrainer(model, cfg, tokenizer.pad_token_id)
    prompts = _prompts(engine.tokenizer, 8)
    generations = engine.generate_batch(prompts)
    samples = [
        TrainSample(g.prompt_ids, g.response_ids, g.logprobs, 1.0 if i % 2 else -1.0, 0)
        for i, g in enumerate(generations)
    ]
    stats = trainer.train_step(samples)
    engine.update_weights(trainer.full_state_dict(), version=1)
    after = engine.generate_batch(prompts[:2])
    free, total = torch.cuda.mem_get_info()
    engine.close()
    width = max(len(g.prompt_ids) + len(g.response_ids) for g in generations)  # one micro-batch, padded
    return {
        "loss": stats.loss,
        "finite": math.isfinite(stats.loss),
        "versions_after": [g.policy_version for g in after],
        "learner_peak_gb": torch.cuda.max_memory_allocated() / 2**30,
        "counted_gb": counted_gb(
            trainer, tokens=len(samples) * width, responses=len(samples) * max(len(s.response_ids) for s in samples)
        ),
        "gpu_total_gb": total / 2**30,
        "gpu_used_gb": (total - free) / 2**30,
    }


def nccl_rank(role: str, port: str, timeout_s: str) -> dict:
    """One end of an NCCL weight group on cuda:0. role "sender": host the store and join as rank 0;
    "receiver": join as rank 1 (a second process on the same GPU: NCCL must refuse it)."""
    from slea.weight_group import WeightGroup, host_store, join_store

    started = time.monotonic()
    try:
        if role == "sender":
            store = host_store("127.0.0.1", 2, float(timeout_s))
            Path(port).write_text(str(store.port))  # `port` is a file the other rank reads it from
            group = WeightGroup(store, 0, 2, "nccl", float(timeout_s), "cuda:0")
        else:
            while not Path(port).exists() or not Path(port).read_text():
                time.sleep(0.1)
            store = join_store("127.0.0.1", int(Path(port).read_text()), 2, float(timeout_s))
            group = WeightGroup(store, 1, 2, "nccl", float(timeout_s), "cuda:0")
        group.close()
        error = None
    except Exception as exc:  # what the test looks for: an error, in bounded time
        error = repr(exc)[:500]
    return {"error": error, "seconds": time.monotonic() - started}


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(globals()[sys.argv[1]](*sys.argv[3:])))
