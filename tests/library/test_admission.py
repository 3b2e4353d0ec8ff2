"""Admission rules: pure decisions with hand numbers, then the Library applying them (real embeddings)."""

import numpy as np
import pytest

from library import admission
from library.admission import EpisodeOutcome, Evidence, decide, utility_evidence
from library.experience import STRATEGY, WARNING, Candidate
from library.state import Library
from library_helpers import candidate, library_config

UNIT_X, UNIT_Y = np.array([1.0, 0.0], dtype=np.float32), np.array([0.0, 1.0], dtype=np.float32)


def test_decide_room_full_duplicate():
    empty = np.zeros((0, 2), dtype=np.float32)
    assert decide(UNIT_X, 0.5, [], empty, {}, capacity=2, dedup_threshold=0.85).action == admission.ADMIT
    full = {"a": 0.3, "b": 0.7}
    assert decide(UNIT_X, 0.5, [], empty, full, 2, 0.85) == admission.Decision(admission.REPLACE, "a")
    assert decide(UNIT_X, 0.3, [], empty, full, 2, 0.85).action == admission.REJECT  # ties do not replace
    near = np.array([[0.6, 0.8], [0.9, np.sqrt(1 - 0.81)]], dtype=np.float32)
    merged = decide(UNIT_X, 0.1, ["p", "q"], near, full, 2, 0.85)
    assert merged.action == admission.MERGE and merged.target_id == "q" and merged.similarity == pytest.approx(0.9)
    assert decide(UNIT_X, 0.9, ["p"], near[:1], {}, 0, 0.85).action == admission.REJECT  # a level of capacity 0


def test_utility_evidence_takes_gain_only_from_ab_halves():
    A, B = True, False  # with_experience of the A and B halves
    episodes = [
        EpisodeOutcome("g1", True, frozenset({"x"}), A),
        EpisodeOutcome("g1", False, frozenset({"x", "y"}), A),
        EpisodeOutcome("g1", True, frozenset(), A),
        EpisodeOutcome("g1", True, frozenset(), B),
        EpisodeOutcome("g1", False, frozenset(), B),  # g1: B half 1/2; A shown x 1/2 -> 0 over 2; A shown y 0/1 -> -0.5 over 1
        EpisodeOutcome("g2", True, frozenset({"x"}), A),
        EpisodeOutcome("g2", False, frozenset(), B),
        EpisodeOutcome("g2", False, frozenset(), B),  # g2: B half 0/2; A shown x 1/1 -> +1 over 1
        EpisodeOutcome("g3", False, frozenset({"w"}), A),
        EpisodeOutcome("g3", True, frozenset(), A),
        EpisodeOutcome("g3", False, frozenset({"w", "x"}), A),  # g3: no B half -> exposures, no gain
    ]
    evidence = utility_evidence(episodes)
    assert evidence["x"] == Evidence(exposures=4, gain=pytest.approx((0.0 * 2 + 1.0 * 1) / 3), compared=3)
    assert evidence["y"] == Evidence(exposures=1, gain=pytest.approx(-0.5), compared=1)
    # a warning shown only to the failures of a group without halves: before, 0/2 with it - 1/1 without = -1
    assert evidence["w"] == Evidence(exposures=2, gain=None, compared=0)
    assert utility_evidence([EpisodeOutcome("grpo", True, frozenset(), B)]) == {}  # B everywhere: a run without the library
    assert admission.exponential_average(0.0, -1.0, 0.2) == pytest.approx(-0.2)


def test_prune_rule_counts_consecutive_low_windows():
    assert admission.low_windows_after(-0.25, 0, -0.25) == 1  # at the threshold counts
    assert admission.low_windows_after(-0.24, 1, -0.25) == 0  # above it resets the run
    assert admission.low_windows_after(-0.9, 1, -0.25) == 2
    assert admission.should_prune(2, 8, windows=2, min_exposures=8)
    assert not admission.should_prune(1, 8, windows=2, min_exposures=8)
    assert not admission.should_prune(2, 7, windows=2, min_exposures=8)


LESSONS = [  # distinct enough that none merges with another (checked below)
    "Open the fridge before looking for cold items.",
    "Slice the bread with a knife from the drawer.",
    "Turn on the desk lamp to examine small objects.",
    "Put clean plates back into the cabinet.",
]


def test_capacity_replace_the_minimum_reject_below_and_exact_counters(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)  # capacity 2 per level
    quota = {STRATEGY: 10, WARNING: 5}
    report = library.admit([candidate(LESSONS[0], 0.5), candidate(LESSONS[1], 0.2)], quota)
    assert len(report.admitted) == 2 and quota[STRATEGY] == 8
    weakest = next(e.id for e in library.experiences.values() if e.score == 0.2)
    report = library.admit([candidate(LESSONS[2], 0.4)], quota)  # level full: 0.4 beats the minimum 0.2
    assert report.evicted == [(STRATEGY, weakest)] and weakest not in library.experiences
    report = library.admit([candidate(LESSONS[3], 0.3)], quota)  # 0.3 does not beat the minimum 0.4
    assert report.rejected == [(STRATEGY, "below_minimum")]
    assert sorted(e.score for e in library.experiences.values()) == [0.4, 0.5]
    assert library.admit([candidate(LESSONS[3], 0.1, level="example")], quota).admitted  # other level has room
    assert library.counters == {"admitted": 4, "merged": 0, "rejected": 1, "evicted": 1, "pruned": 0, "clusters_evicted": 0}


def test_duplicates_merge_keeping_the_higher_score(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)
    quota = {STRATEGY: 10, WARNING: 5}
    original = library.admit([candidate("Open the fridge before looking for cold food.", 0.3)], quota).admitted[0]
    report = library.admit([candidate("Open the fridge before you look for cold food.", 0.9,
                                      observation="You are in front of the fridge 1.")], quota)
    assert report.merged == [original] and not report.admitted
    merged = library.experiences[original]
    assert merged.score == 0.9 and merged.text == "Open the fridge before you look for cold food."
    assert len(merged.clusters) == 2  # triggers of both
    warning = library.admit([candidate("Open the fridge before looking for cold food.", 0.5, zone=WARNING, level="mistake")], quota)
    assert warning.admitted  # dedup stays within a zone
    assert library.counters["merged"] == 1 and library.counters["admitted"] == 2


def test_rate_limit_rejects_beyond_the_window_quota(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)
    report = library.admit([candidate(LESSONS[0], 0.9), candidate(LESSONS[1], 0.8, level="example")], {STRATEGY: 1})
    assert len(report.admitted) == 1 and report.rejected == [(STRATEGY, "rate_limit")]
    assert library.experiences[report.admitted[0]].score == 0.9  # best first


def lessons_library(embedder, tokenizer, count, **config):
    library = Library(library_config(**config), embedder, tokenizer)
    ids = library.admit([candidate(LESSONS[i], 0.5, level="method" if i < 2 else "example") for i in range(count)],
                        {STRATEGY: 10}).admitted
    return library, ids


def test_two_consecutive_windows_at_or_below_the_threshold_prune(embedder, policy_tokenizer):
    # utility_rate 1: the utility is the window's gain, so the numbers below are the utilities
    library, (at, above, back) = lessons_library(embedder, policy_tokenizer, 3, utility_rate=1.0, prune_min_exposures=1)

    def window(**gains):
        return [e.id for e in library.apply_utility({i: Evidence(1, gain, 0 if gain is None else 1) for i, gain in gains.items()}, {})]

    assert window(**{at: -0.25, above: -0.24, back: -0.3}) == []
    assert [library.experiences[i].low_windows for i in (at, above, back)] == [1, 0, 1]
    assert window(**{at: -0.25, above: -0.24, back: 0.1}) == [at]  # -0.25 twice: pruned; -0.24 never counts
    assert library.experiences[back].low_windows == 0  # one window above resets the run
    assert window(**{above: -0.24, back: -0.3}) == []
    assert window(**{back: None}) == []  # a window without A/B evidence for it: no verdict either way
    assert library.experiences[back].low_windows == 1 and library.experiences[back].exposures == 4
    assert window(**{back: -0.3}) == [back]
    assert library.counters["pruned"] == 2 and set(library.experiences) == {above}
    assert window(**{at: -1.0}) == []  # gone items are skipped, not resurrected


def test_pruning_waits_for_enough_ab_exposures_and_smooths_the_utility(embedder, policy_tokenizer):
    library, (item,) = lessons_library(embedder, policy_tokenizer, 1, utility_rate=0.5, prune_min_exposures=3)
    found = Evidence(exposures=2, gain=-1.0, compared=1)
    assert library.apply_utility({item: found}, {item: 5}) == []  # utility 0.5 * -1 = -0.5: one low window
    assert library.apply_utility({item: found}, {item: 5}) == []  # -0.75: two low windows, but 2 of 3 A-half episodes
    experience = library.experiences[item]
    assert (experience.utility, experience.low_windows, experience.compared, experience.exposures, experience.usage) == (
        pytest.approx(-0.75), 2, 2, 4, 10)
    assert [e.id for e in library.apply_utility({item: found}, {})] == [item]  # -0.875, 3 A-half episodes


def test_a_warning_shown_only_in_failures_of_groups_without_ab_halves_keeps_its_place(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)  # default prune settings
    (warning,) = library.admit([candidate(LESSONS[0], 0.5, zone=WARNING, level="mistake")], {WARNING: 1}).admitted
    for window in range(6):  # before: -1 per window, pruned after the second (8 exposures, utility -0.36 < 0)
        episodes = [EpisodeOutcome(f"g{window}-{group}", success, frozenset() if success else frozenset({warning}), True)
                    for group in range(2) for success in (True, True, False, False)]
        assert library.apply_utility(utility_evidence(episodes), {warning: 6}) == []
    kept = library.experiences[warning]
    assert (kept.utility, kept.low_windows, kept.compared, kept.exposures, kept.usage) == (0.0, 0, 0, 24, 36)


def test_an_item_whose_line_exceeds_the_actors_budget_is_rejected_before_it_can_merge(embedder, policy_tokenizer):
    from actors.prompts import Experience as Shown, PromptBuilder

    fits = "Open the fridge before looking for cold items."
    longer = "Open the fridge before looking for cold items, then close it."  # a near-duplicate of `fits`
    budget = policy_tokenizer.encode(f"- {fits}\n", add_special_tokens=False)
    library = Library(library_config(max_tokens=len(budget)), embedder, policy_tokenizer)
    assert library.prompt_line_tokens(fits) == len(budget) < library.prompt_line_tokens(longer)
    actor = PromptBuilder(policy_tokenizer, max_experience_tokens=len(budget))  # what the actor would show
    assert [e.text for e in actor.fit_experiences([Shown("a", STRATEGY, fits)])] == [fits]
    assert actor.fit_experiences([Shown("b", STRATEGY, longer)]) == []

    quota = {STRATEGY: 10, WARNING: 5}
    (kept,) = library.admit([candidate(fits, 0.5)], quota).admitted  # exactly the budget: admitted
    # a short warning whose "Avoid: ..." part makes its line too long: the whole line is what the prompt shows
    warning = Candidate(WARNING, "mistake", "Do not eat the apple.", "", "pick", ["You are in the kitchen."], 0.8, ["ep"],
                        avoid_action=" and ".join(["eat apple 1"] * 20))
    report = library.admit([candidate(longer, 0.9), warning], quota)
    assert report.rejected == [(STRATEGY, "over_token_budget"), (WARNING, "over_token_budget")]
    assert not report.merged and library.experiences[kept].text == fits and library.experiences[kept].score == 0.5
    assert library.counters["rejected"] == 2 and quota == {STRATEGY: 9, WARNING: 5}
    roomy = Library(library_config(), embedder, policy_tokenizer)  # the default 200 tokens: the same pair merges
    roomy.admit([candidate(fits, 0.5)], dict(quota))
    assert roomy.admit([candidate(longer, 0.9)], dict(quota)).merged
    with pytest.raises(RuntimeError, match="no policy tokenizer"):  # a replica's copy cannot admit
        Library(library_config(), embedder).admit([candidate(fits, 0.5)], dict(quota))


def test_every_commit_bumps_the_version_once(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)
    assert library.commit() is None and library.version == 0
    library.admit([candidate(LESSONS[0], 0.5)], {STRATEGY: 1})
    delta = library.commit()
    assert (delta["from_version"], delta["version"], library.version) == (0, 1, 1)
    assert len(delta["experiences"]) == 1 and len(delta["clusters"]) == 1
    assert library.commit() is None
