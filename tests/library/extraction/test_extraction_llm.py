"""The llm extractor: the strict parser on scripted answers, then real generation.

Real generation: a randomly initialised model of SmolLM2's family answers free-form garbage,
which must be rejected and counted; SmolLM2-135M-Instruct with guided decoding answers JSON
of the right shape, which must become candidates and be admitted.
"""

import json

import pytest
from library_helpers import episode_of, library_config

from library.experience import STRATEGY, WARNING
from library.extraction import parse
from library.extraction.llm import LLMExtractor, TransformersChat
from library.state import Library

OBS = ["You see a countertop 1 and a fridge 1.", "You pick up the apple 1."]
SUCCESS = episode_of("s", OBS, ["take apple 1 from countertop 1", "put apple 1 in fridge 1"], success=True)
FAILURE = episode_of("f", OBS, ["take apple 1 from countertop 1", "eat apple 1"], success=False)

VALID_B = json.dumps(
    [
        {
            "level": "method",
            "content": "Take the apple before opening the fridge.",
            "cue": "apple on countertop",
            "step": 0,
        },
        {"level": "example", "content": "put apple 1 in fridge 1 finished it.", "cue": "holding the apple", "step": 1},
    ]
)
VALID_C = (
    '```json\n[{"level": "mistake", "content": "Eating the apple ends the task.", "trigger": "holding the apple",'
    ' "step": 1, "avoid": "eat apple 1", "instead": "put apple 1 in fridge 1"}]\n```'
)


def test_valid_answers_become_candidates_of_the_named_steps():
    method, example = parse.parse_strategies(VALID_B, SUCCESS)
    assert (method.zone, method.level, method.trigger_observations) == (STRATEGY, "method", [OBS[0]])
    assert example.trigger_observations == [OBS[1]] and example.source_episode_ids == ["s"]
    (warning,) = parse.parse_warnings(VALID_C, FAILURE)  # one ``` fence is accepted
    assert (warning.zone, warning.avoid_action, warning.instead_action) == (
        WARNING,
        "eat apple 1",
        "put apple 1 in fridge 1",
    )
    assert parse.parse_strategies("[]", SUCCESS) == []  # nothing to add is a valid answer


@pytest.mark.parametrize(
    "answer, reason",
    [
        ('Here are the lessons: [{"level": "method"}]', "not_json"),
        ('[{"level": "method", "content": "Take the apple first.", "cue": "x", "step": 0}', "not_json"),
        ('{"level": "method", "content": "Take the apple first.", "cue": "x", "step": 0}', "not_a_list"),
        (
            json.dumps([{"level": "method", "content": "Take the apple first.", "cue": "x", "step": 0}] * 4),
            "too_many_items",
        ),
        ('[{"level": "strategy", "content": "Take the apple first.", "cue": "x", "step": 0}]', "bad_item"),
        ('[{"level": "method", "content": "Take the apple first.", "cue": "x", "step": 5}]', "bad_item"),
        ('[{"level": "method", "content": "Take the apple first.", "cue": "x", "step": "first"}]', "bad_item"),
        ('[{"level": "method", "content": "", "cue": "x", "step": 0}]', "bad_item"),
    ],
)
def test_malformed_answers_are_rejected_with_a_reason(answer, reason):
    with pytest.raises(parse.ExtractionRejected) as caught:
        parse.parse_strategies(answer, SUCCESS)
    assert caught.value.reason == reason


def test_scripted_generator_counts_rejections_and_admits_valid_output(embedder, policy_tokenizer):
    answers = iter(["not json at all", VALID_B])
    extractor = LLMExtractor(lambda prompt, item_type: next(answers))
    assert extractor.distil_success(SUCCESS, []) == []
    candidates = extractor.distil_success(SUCCESS, [])
    assert extractor.rejected == {"not_json": 1} and extractor.calls == {"B": 2}
    library = Library(library_config(), embedder, policy_tokenizer)
    assert len(library.admit(candidates, {STRATEGY: 10}).admitted) == 2


def test_prompts_show_every_step_and_the_contrast():
    from library.extraction.prompts import prompt_b, prompt_c

    text = prompt_b(SUCCESS, ["Open the fridge first."])
    assert all(obs in text for obs in OBS) and "put apple 1 in fridge 1" in text and "- Open the fridge first." in text
    contrast = prompt_c(FAILURE, SUCCESS)
    assert "eat apple 1" in contrast and "successful trajectory of the same task" in contrast


@pytest.mark.slow
def test_random_model_output_is_rejected_and_counted(embedder):
    from slea.models import tiny_model

    model, tokenizer = tiny_model()
    extractor = LLMExtractor(TransformersChat(model, tokenizer, max_new_tokens=24, guided=False))
    assert extractor.distil_success(SUCCESS, []) == [] and extractor.distil_failure(FAILURE, SUCCESS) == []
    assert sum(extractor.rejected.values()) == 2, extractor.last_answer


@pytest.mark.slow
def test_smollm2_guided_answer_is_valid_and_admitted(embedder):
    from slea.models import load_model

    model, tokenizer = load_model("smollm2-135m-instruct")
    extractor = LLMExtractor(TransformersChat(model, tokenizer, max_new_tokens=32))
    candidates = extractor.distil_failure(FAILURE, None)
    assert not extractor.rejected, extractor.last_answer
    assert len(candidates) == 1 and candidates[0].zone == WARNING and candidates[0].trigger_observations[0] in OBS
    library = Library(library_config(), embedder, tokenizer)
    report = library.admit(candidates, {WARNING: 5})
    assert len(report.admitted) == 1 and library.counters["admitted"] == 1
