"""Admission rules: pure decisions with hand numbers, then the Library applying them (real embeddings)."""

import numpy as np
import pytest
from library_helpers import candidate, episode_of, library_config

from library import admission
from library.admission import EpisodeOutcome, Evidence, decide, utility_evidence
from library.experience import STRATEGY, WARNING, Candidate
from library.state import Library

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


A, B = True, False  # with_experience of the A and B halves


def outcome(
    group_id: str,
    success: bool,
    half: bool,
    visited: tuple[str, ...] = (),
    shown: dict | None = None,
    unclustered: tuple[str, ...] = (),
) -> EpisodeOutcome:
    """An episode that reached the clusters `visited` and those of `shown` (item -> clusters it was
    shown at), and was shown the items of `unclustered` only at steps without a cluster."""
    shown = {item: frozenset(clusters) for item, clusters in (shown or {}).items()}
    return EpisodeOutcome(
        group_id,
        success,
        frozenset(shown) | frozenset(unclustered),
        half,
        frozenset(visited).union(*shown.values()),
        shown,
    )


def neutral_warning_group(group_id: str) -> list[EpisodeOutcome]:
    """Both halves alike: of the two episodes of each half that walk into "trap", one fails; the
    other two never get there and succeed. The A pair is shown the warning "w" at "trap"."""
    return [
        outcome(group_id, False, A, ("start",), {"w": ("trap",)}),
        outcome(group_id, True, A, ("start",), {"w": ("trap",)}),
        outcome(group_id, True, A, ("start", "exit")),
        outcome(group_id, True, A, ("start", "exit")),
        outcome(group_id, False, B, ("start", "trap")),
        outcome(group_id, True, B, ("start", "trap")),
        outcome(group_id, True, B, ("start", "exit")),
        outcome(group_id, True, B, ("start", "exit")),
    ]


def test_a_neutral_warning_cued_by_failure_gains_nothing():
    # treated 1/2 - B episodes that reached "trap" 1/2 = 0; before: 1/2 - whole B half 3/4 = -0.25, every window
    assert utility_evidence(neutral_warning_group("g1")) == {"w": Evidence(exposures=2, gain=0.0, compared=2)}


def test_a_neutral_warning_cued_by_failure_is_never_pruned(embedder, policy_tokenizer):
    # the literal rule (utility_rate 1) and 2 A-half episodes per window: before, -0.25 twice pruned it in window 2
    library = Library(library_config(utility_rate=1.0, prune_min_exposures=2), embedder, policy_tokenizer)
    (warning,) = library.admit([candidate(LESSONS[0], 0.5, zone=WARNING, level="mistake")], {WARNING: 1}).admitted
    for window in range(4):
        group = [
            outcome(
                e.group_id,
                e.success,
                e.with_experience,
                tuple(e.visited_clusters),
                {warning: e.shown_in["w"]} if e.shown_in else None,
            )
            for e in neutral_warning_group(f"g{window}")
        ]
        assert library.apply_utility(utility_evidence(group), {}) == []
    kept = library.experiences[warning]
    assert (kept.utility, kept.low_windows, kept.compared, kept.exposures) == (0.0, 0, 8, 8)


def test_a_harmful_item_scores_its_treated_against_the_matched_controls():
    episodes = [
        # g1: treated (shown s at "shelf") 1/3; B episodes that reached "shelf" 2/3 -> -1/3 over 3
        outcome("g1", True, A, (), {"s": ("shelf",)}),
        outcome("g1", False, A, (), {"s": ("shelf",)}),
        outcome("g1", False, A, (), {"s": ("shelf",)}),
        outcome("g1", True, A, ("desk",)),  # never reached "shelf": neither arm
        outcome("g1", True, B, ("shelf",)),
        outcome("g1", True, B, ("desk", "shelf")),
        outcome("g1", False, B, ("shelf",)),
        outcome(
            "g1", False, B, ("desk",)
        ),  # never reached "shelf": not a control (it would count against the whole B half)
        # g2: s shown at "shelf" in one episode and at "desk" in another: C(s) = both; controls reached either
        outcome("g2", False, A, (), {"s": ("shelf",)}),
        outcome("g2", True, A, (), {"s": ("desk",)}),  # treated 1/2
        outcome("g2", True, B, ("desk",)),
        outcome("g2", True, B, ("shelf",)),  # controls 2/2 -> -1/2 over 2
        outcome("g2", False, B, ("hall",)),
    ]
    evidence = utility_evidence(episodes)
    # -0.4; before, against the whole B halves: g1 1/3 - 2/4, g2 1/2 - 2/3, both -1/6
    assert evidence["s"] == Evidence(exposures=5, gain=pytest.approx((-1 / 3 * 3 + -0.5 * 2) / 5), compared=5)


def test_no_evidence_without_a_b_episode_in_the_items_clusters():
    episodes = [
        outcome("g1", False, A, ("start",), {"x": ("trap",)}),
        outcome("g1", True, A, ("start",), {"y": ("start",)}, unclustered=("x",)),  # x only at a step without a cluster
        outcome("g1", True, B, ("start",)),
        outcome("g1", False, B, ("start",)),  # no B episode reached "trap"
        outcome("g2", False, A, (), {"x": ("trap",)}),
        outcome("g2", True, A, ("trap",)),  # g2: no B half -> exposures, no gain
    ]
    evidence = utility_evidence(episodes)
    assert evidence["x"] == Evidence(exposures=3, gain=None, compared=0)
    assert evidence["y"] == Evidence(exposures=1, gain=pytest.approx(1.0 - 0.5), compared=1)  # the same B half, matched
    assert utility_evidence([outcome("grpo", True, B, ("start",))]) == {}  # B everywhere: a run without the library
    assert admission.exponential_average(0.0, -1.0, 0.2) == pytest.approx(-0.2)


def test_an_episode_outcome_keeps_the_clusters_of_its_steps_and_where_each_item_was_shown():
    episode = episode_of(
        "e",
        ["You are in the kitchen.", "You see a fridge 1.", "You open the fridge 1.", "It is cold."],
        ["look", "go to fridge 1", "open fridge 1", "look"],
        success=True,
        experience_ids=[["x"], ["x", "y"], ["y"], ["z"]],
        clusters=["", "pick/c1", "pick/c2", "pick/c1"],
    )
    found = episode.outcome()
    assert (found.group_id, found.success, found.with_experience) == ("g0", True, True)
    assert found.injected_ids == {"x", "y", "z"} and found.visited_clusters == {"pick/c1", "pick/c2"}
    # x at step 0 (warm-up: no cluster) cannot be matched; only its showing in "pick/c1" counts
    assert found.shown_in == {"x": {"pick/c1"}, "y": {"pick/c1", "pick/c2"}, "z": {"pick/c1"}}


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
    assert library.counters == {
        "admitted": 4,
        "merged": 0,
        "rejected": 1,
        "evicted": 1,
        "pruned": 0,
        "clusters_evicted": 0,
    }


def test_duplicates_merge_keeping_the_higher_score(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)
    quota = {STRATEGY: 10, WARNING: 5}
    original = library.admit([candidate("Open the fridge before looking for cold food.", 0.3)], quota).admitted[0]
    report = library.admit(
        [
            candidate(
                "Open the fridge before you look for cold food.", 0.9, observation="You are in front of the fridge 1."
            )
        ],
        quota,
    )
    assert report.merged == [original] and not report.admitted
    merged = library.experiences[original]
    assert merged.score == 0.9 and merged.text == "Open the fridge before you look for cold food."
    assert len(merged.clusters) == 2  # triggers of both
    warning = library.admit(
        [candidate("Open the fridge before looking for cold food.", 0.5, zone=WARNING, level="mistake")], quota
    )
    assert warning.admitted  # dedup stays within a zone
    assert library.counters["merged"] == 1 and library.counters["admitted"] == 2


def test_rate_limit_rejects_beyond_the_window_quota(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)
    report = library.admit([candidate(LESSONS[0], 0.9), candidate(LESSONS[1], 0.8, level="example")], {STRATEGY: 1})
    assert len(report.admitted) == 1 and report.rejected == [(STRATEGY, "rate_limit")]
    assert library.experiences[report.admitted[0]].score == 0.9  # best first


def lessons_library(embedder, tokenizer, count, **config):
    library = Library(library_config(**config), embedder, tokenizer)
    ids = library.admit(
        [candidate(LESSONS[i], 0.5, level="method" if i < 2 else "example") for i in range(count)], {STRATEGY: 10}
    ).admitted
    return library, ids


def test_two_consecutive_windows_at_or_below_the_threshold_prune(embedder, policy_tokenizer):
    # utility_rate 1: the utility is the window's gain, so the numbers below are the utilities
    library, (at, above, back) = lessons_library(embedder, policy_tokenizer, 3, utility_rate=1.0, prune_min_exposures=1)

    def window(**gains):
        return [
            e.id
            for e in library.apply_utility(
                {i: Evidence(1, gain, 0 if gain is None else 1) for i, gain in gains.items()}, {}
            )
        ]

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
    assert (
        experience.utility,
        experience.low_windows,
        experience.compared,
        experience.exposures,
        experience.usage,
    ) == (pytest.approx(-0.75), 2, 2, 4, 10)
    assert [e.id for e in library.apply_utility({item: found}, {})] == [item]  # -0.875, 3 A-half episodes


def test_a_warning_shown_only_in_failures_of_groups_without_ab_halves_keeps_its_place(embedder, policy_tokenizer):
    library = Library(library_config(), embedder, policy_tokenizer)  # default prune settings
    (warning,) = library.admit([candidate(LESSONS[0], 0.5, zone=WARNING, level="mistake")], {WARNING: 1}).admitted
    for window in range(6):  # before: -1 per window, pruned after the second (8 exposures, utility -0.36 < 0)
        episodes = [
            outcome(f"g{window}-{group}", success, A, ("start",), None if success else {warning: ("trap",)})
            for group in range(2)
            for success in (True, True, False, False)
        ]
        assert library.apply_utility(utility_evidence(episodes), {warning: 6}) == []
    kept = library.experiences[warning]
    assert (kept.utility, kept.low_windows, kept.compared, kept.exposures, kept.usage) == (0.0, 0, 0, 24, 36)


def test_an_item_whose_line_exceeds_the_actors_budget_is_rejected_before_it_can_merge(embedder, policy_tokenizer):
    from actors.prompts import Experience as Shown
    from actors.prompts import PromptBuilder

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
    warning = Candidate(
        WARNING,
        "mistake",
        "Do not eat the apple.",
        "",
        "pick",
        ["You are in the kitchen."],
        0.8,
        ["ep"],
        avoid_action=" and ".join(["eat apple 1"] * 20),
    )
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
