"""Imported by vllm_probe.py (the CPU tier) and tests/gpu/gpu_probes.py (the GPU tier's one vLLM
process), each on its own engine: reset VllmEngine's prefix cache while a request is generating, and
count the prompt tokens a repeated prompt found cached before and after the reset."""

import asyncio


def prefix_cache_reset(engine) -> dict:
    """On a VllmEngine: {"before", "after": prompt tokens a repeated prompt found cached before and
    after a reset made while another request generates, "error": what the reset raised, or None}."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    cached = engine.tokenizer("You are in the middle of a room. " * 40)["input_ids"][:320]  # many full KV blocks
    running = engine.tokenizer("Your task is to: put a mug in the sink. " * 4)["input_ids"]

    async def cached_tokens(prompt, max_tokens=1, started=None) -> int:
        final = None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        async for output in engine._engine.generate(
            TokensPrompt(prompt_token_ids=prompt), params, request_id=str(id(params))
        ):
            if started is not None and not started.is_set():
                started.set()
            final = output
        return final.num_cached_tokens

    async def scenario():
        await cached_tokens(cached)
        before = await cached_tokens(cached)  # the prompt's blocks are cached now
        started = asyncio.Event()
        long_request = asyncio.create_task(cached_tokens(running, max_tokens=200, started=started))
        await started.wait()  # it holds KV blocks while the reset runs
        error = None
        try:
            await engine.reset_prefix_cache()
        except Exception as exc:
            error = repr(exc)
        await long_request
        after = await cached_tokens(cached)
        return {"before": before, "after": after, "error": error}

    # On the engine's own loop, where its public calls run: AsyncLLM, used directly here, serves
    # only the loop it was made in.
    return asyncio.run_coroutine_threadsafe(scenario(), engine._loop).result()
