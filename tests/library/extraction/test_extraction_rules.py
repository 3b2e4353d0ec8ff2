"""The rules extractor on scripted trajectories: same input, same lessons."""

from library_helpers import episode_of

from library.extraction.rules import RulesExtractor

OBS = [
    "You are in the kitchen. You see a fridge 1 and a countertop 1.",
    "On the countertop 1, you see an apple 1.",
    "You pick up the apple 1.",
    "The fridge 1 is open. It is empty.",
]


def test_success_yields_its_whole_plan_and_finishing_move():
    success = episode_of(
        "s",
        OBS,
        ["go to countertop 1", "take apple 1", "go to fridge 1", "put apple 1 in fridge 1"],
        success=True,
        budget=8,
    )
    plan, finish = RulesExtractor().distil_success(success, existing=[])
    assert plan.level == "method" and plan.zone == "strategy"
    assert plan.content == (
        "A plan that solved this pick task: go to countertop 1; take apple 1; go to fridge 1; put apple 1 in fridge 1."
    )
    assert plan.trigger_observations == OBS  # every state it passed through, not only the first
    assert plan.score == 1.0 + 1.0 - 0.5 * 4 / 8 and plan.source_episode_ids == ["s"]
    assert finish.level == "example" and finish.trigger_observations == [OBS[-1]]
    assert "'put apple 1 in fridge 1' completed the task" in finish.content


def test_failure_yields_mistake_pattern_and_diagnostic():
    failure = episode_of(
        "f",
        OBS,
        ["go to countertop 1", "jump", "go to countertop 1", "go to countertop 1"],
        success=False,
        valid=[True, False, True, True],
        budget=4,
    )
    reference = episode_of("s", OBS[:2], ["go to countertop 1", "take apple 1"], success=True)
    mistake, pattern, diagnostic = RulesExtractor().distil_failure(failure, reference)
    assert (mistake.level, mistake.avoid_action, mistake.trigger_observations) == ("mistake", "jump", [OBS[1]])
    assert mistake.instead_action == "take apple 1"  # what the group's success did in that state
    assert pattern.content == "Repeating 'go to countertop 1' (3 times) made no progress."
    assert pattern.trigger_observations == [OBS[0], OBS[2], OBS[3]]
    assert (
        diagnostic.content == "The episode failed after: jump; go to countertop 1; go to countertop 1 (used 4/4 steps)."
    )
    assert diagnostic.trigger_observations == OBS[1:]  # the last three states, not the first
    assert mistake.score == 0.5 * 4 / 4 + 1 / 4  # budget burnt + invalid share
    assert mistake.text() == "'jump' was not a valid action in this state. Avoid: jump. Instead: take apple 1."


def test_clean_failure_without_repeats_gets_only_a_diagnostic():
    failure = episode_of("f", OBS[:2], ["go to fridge 1", "open fridge 1"], success=False)
    warnings = RulesExtractor().distil_failure(failure, None)
    assert [w.level for w in warnings] == ["diagnostic"] and warnings[0].instead_action == ""
