"""The CPU engine returns exactly what it sampled, with log-probs a forward pass agrees with."""

import asyncio
import time

import numpy as np
import pytest
import torch
from helpers import forward_logprobs

from actors.engines.base import SamplingSettings
from actors.engines.transformers_engine import TransformersEngine
from slea.models import tiny_model

pytestmark = pytest.mark.slow  # the tiny model in the engine


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(seed=3)


def prompts(tokenizer):
    texts = ["You are in the middle of a room.", "Your task is to: put a mug in the sink. Go!", "hi"]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for t in texts
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_a_forward_pass_of_the_same_model(tiny, temperature):
    model, tokenizer = tiny
    engine = TransformersEngine(model, tokenizer, SamplingSettings(temperature=temperature, max_new_tokens=12))
    batch = prompts(tokenizer)  # different lengths: left padding is exercised
    for prompt, generation in zip(batch, engine.generate_batch(batch)):
        assert generation.prompt_ids == list(prompt)
        assert (
            generation.response_ids.dtype == np.int32 and len(generation.response_ids) == len(generation.logprobs) > 0
        )
        expected = forward_logprobs(model, prompt, generation.response_ids, temperature or 1.0)
        np.testing.assert_allclose(generation.logprobs, expected, atol=2e-4)
        assert generation.policy_version == 0


def test_response_is_cut_after_the_stop_text_or_eos(tiny):
    model, tokenizer = tiny
    engine = TransformersEngine(model, tokenizer, SamplingSettings())
    text = "<think>the mug is dirty</think><action>go to sinkbasin 1</action> and more text after"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    finished = engine._finish([1, 2], tokens, np.zeros(len(tokens), dtype=np.float32), {})
    assert finished.text.endswith("</action>") and finished.finish_reason == "stop"
    assert (
        tokenizer.decode(finished.response_ids) == "<think>the mug is dirty</think><action>go to sinkbasin 1</action>"
    )
    with_eos = tokenizer.encode("<action>look", add_special_tokens=False) + [tokenizer.eos_token_id, 5, 6]
    finished = engine._finish([1], with_eos, np.zeros(len(with_eos), dtype=np.float32), {})
    assert finished.response_ids[-1] == tokenizer.eos_token_id and finished.finish_reason == "stop"
    unfinished = engine._finish([1], tokens[:5], np.zeros(5, dtype=np.float32), {})
    assert unfinished.finish_reason == "length" and len(unfinished.response_ids) == 5


def test_concurrent_requests_are_batched_and_answered_in_order(tiny):
    model, tokenizer = tiny
    engine = TransformersEngine(model, tokenizer, SamplingSettings(max_new_tokens=4), max_batch=8)
    batch_sizes = []
    original = engine.generate_batch

    def counting(batch):
        batch_sizes.append(len(batch))
        return original(batch)

    engine.generate_batch = counting
    requests = prompts(tokenizer) * 2

    async def run_all():
        return await asyncio.gather(*(engine.generate(prompt) for prompt in requests))

    results = asyncio.run(run_all())
    assert [r.prompt_ids for r in results] == [list(p) for p in requests]
    assert batch_sizes == [6]


def test_a_batch_reports_its_prefill_and_decode_seconds(tiny):
    """The prompt's forward ends where `generate` first asks for scores; every later token is decode.
    Both are the batch's, given to each of its generations, and together no longer than the call."""
    model, tokenizer = tiny
    engine = TransformersEngine(model, tokenizer, SamplingSettings(temperature=0.0, max_new_tokens=6))
    started = time.perf_counter()
    generations = engine.generate_batch(prompts(tokenizer))
    wall = time.perf_counter() - started
    first = generations[0]
    assert first.prefill_s > 0 and first.decode_s > 0 and first.prefill_s + first.decode_s <= wall
    assert all(
        (g.prefill_s, g.decode_s, g.cached_prompt_tokens) == (first.prefill_s, first.decode_s, 0) for g in generations
    )


def test_new_weights_apply_before_the_next_generation():
    model, tokenizer = tiny_model(seed=3)  # its own copy: the weights get replaced
    engine = TransformersEngine(model, tokenizer, SamplingSettings(temperature=0.0, max_new_tokens=6))
    prompt = prompts(tokenizer)[0]
    before = engine.generate_batch([prompt])[0]
    other, _ = tiny_model(seed=11)
    engine.update_weights(other.state_dict(), version=4)
    assert engine.policy_version == 0  # staged, not yet applied
    after = engine.generate_batch([prompt])[0]
    assert after.policy_version == 4 and engine.policy_version == 4
    np.testing.assert_allclose(after.logprobs, forward_logprobs(other, prompt, after.response_ids), atol=2e-4)
    assert not np.allclose(before.logprobs[:1], forward_logprobs(other, prompt, before.response_ids)[:1], atol=1e-3)


def test_weights_with_a_renamed_key_are_refused_and_nothing_is_loaded():
    model, tokenizer = tiny_model(seed=3)
    engine = TransformersEngine(model, tokenizer, SamplingSettings(temperature=0.0, max_new_tokens=6))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    other, _ = tiny_model(seed=11)
    weights = other.state_dict()
    weights["model.norm.scale"] = weights.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\], unexpected \['model.norm.scale'\]"):
        engine.update_weights(weights, version=4)
    engine.generate_batch(prompts(tokenizer)[:1])
    assert engine.policy_version == 0
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())
    del weights["model.norm.scale"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\], unexpected \[\]"):
        engine.update_weights(weights, version=4)
