"""Run by the vLLM engine tests in a subprocess (an interpreter with vllm): drive VllmEngine on a
checkpoint, swap in other weights, then offer weights with a renamed key, then generate a long prompt twice (prefill,
decode and the prefix cache's share as the engine reports them), then reset the prefix
cache while a request generates (vllm_prefix_cache_probe.py), then join the test's weight group
(the test is the learner, rank 0), receive broadcast weights as version 5 and generate again; and
write what was generated, how the renamed key was refused and what the reset left cached as JSON
for the tests to check. One engine start-up serves them all.

usage: python vllm_probe.py CHECKPOINT_DIR NEW_WEIGHTS.safetensors PLAN.json HOST PORT OUT.json TEMPERATURE
"""

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from vllm_prefix_cache_probe import prefix_cache_reset  # noqa: E402  (beside this file, on sys.path[0])


def probe_engine(checkpoint: str, temperature: float):
    """(a small VllmEngine on `checkpoint` sampling at `temperature`, two chat prompts' token ids) for the probes."""
    from actors.engines.base import SamplingSettings
    from actors.engines.vllm_engine import VllmEngine

    engine = VllmEngine(
        checkpoint,
        SamplingSettings(temperature=temperature, max_new_tokens=10),
        engine_args={"gpu_memory_utilization": 0.2, "max_model_len": 1024},
    )
    tokenizer = engine.tokenizer
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for text in ["You are in the middle of a room.", "Your task is to: put a mug in the sink."]
    ]
    return engine, prompts


def generation_json(generation) -> dict:
    return {
        "prompt_ids": generation.prompt_ids,
        "response_ids": generation.response_ids.tolist(),
        "logprobs": generation.logprobs.tolist(),
        "policy_version": generation.policy_version,
        "text": generation.text,
        "prefill_s": generation.prefill_s,
        "decode_s": generation.decode_s,
        "cached_prompt_tokens": generation.cached_prompt_tokens,
    }


def main(checkpoint: str, new_weights: str, plan_path: str, host: str, port: str, out: str, temperature: str) -> None:
    from safetensors.torch import load_file

    async def generate_all(engine, prompts):
        return await asyncio.gather(*(engine.generate(list(p)) for p in prompts))

    async def made_in_a_running_loop():
        # As a Ray async actor makes it (its __init__ runs in the actor's loop), asked from that loop:
        # vLLM's AsyncLLM made in a running loop binds its output handler there at once, and every
        # request waited forever when the engine ran its calls in a loop of its own but was made here.
        engine, prompts = probe_engine(checkpoint, float(temperature))
        return engine, prompts, await generate_all(engine, prompts)

    engine, prompts, first = asyncio.run(made_in_a_running_loop())

    async def scenario():
        # A second event loop, as the in-run evaluator's next evaluation runs in: vLLM's AsyncLLM
        # stays bound to the loop of its first request, and this waited forever before the engine
        # ran every call on a loop of its own.
        engine.update_weights(load_file(new_weights), version=3)
        second = await generate_all(engine, prompts)
        # vLLM itself would skip an unknown name ending in .bias and only warn about the norm it never got.
        renamed = load_file(new_weights)
        renamed["model.norm.bias"] = renamed.pop("model.norm.weight")
        try:
            engine.update_weights(renamed, version=4)
            refused = None
        except ValueError as exc:
            refused = str(exc)
        await engine.generate(list(prompts[0]))  # still generates, with version 3
        # The same long prompt twice, one after the other: the second finds its full KV blocks cached.
        long_prompt = engine.tokenizer("You are in the middle of a room. " * 40)["input_ids"][:320]
        repeated = [await engine.generate(long_prompt) for _ in range(2)]
        return second, refused, engine.policy_version, repeated

    second, refused, version, repeated = asyncio.run(scenario())
    prefix_cache = prefix_cache_reset(engine)

    async def broadcast():
        joined = await engine.join_weight_group(host, int(port), 1 + engine.weight_group_size, "gloo", 300.0)
        # A generation asked for during the transfer waits for it and runs on the new weights.
        receive = asyncio.ensure_future(engine.receive_weights(json.loads(Path(plan_path).read_text()), version=5))
        await asyncio.sleep(0)
        third = await generate_all(engine, prompts)
        await receive
        await engine.leave_weight_group()
        return third, joined

    third, joined = asyncio.run(broadcast())
    Path(out).write_text(
        json.dumps(
            {
                "before": [generation_json(g) for g in first],
                "after": [generation_json(g) for g in second],
                "refused": refused,
                "version_after_refusal": version,
                "prefix_cache": prefix_cache,
                "repeated": [generation_json(g) for g in repeated],
                "broadcast": [generation_json(g) for g in third],
                "joined": joined,
            }
        )
    )
    engine.close()


if __name__ == "__main__":
    main(*sys.argv[1:8])
