"""Admission rules: pure decisions with hand numbers, then the Library applying them (real embeddings)."""

import numpy as np
import pytest

from library import admission
from library.admission import EpisodeOutcome, decide, utility_evidence
from library.experience import STRATEGY, WARNING
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


def test_utility_evidence_compares_within_groups():
    episodes = [
        EpisodeOutcome("g1", True, frozenset({"x"})),
        EpisodeOutcome("g1", True, frozenset({"x"})),
        EpisodeOutcome("g1", False, frozenset()),
        EpisodeOutcome("g1", True, frozenset()),  # g1: with x 2/2, without 1/2 -> +0.5 over 2 exposures
        EpisodeOutcome("g2", False, frozenset({"x", "y"})),
        EpisodeOutcome("g2", True, frozenset()),  # g2: with x 0/1, without 1/1 -> -1 over 1 exposure
        EpisodeOutcome("g3", True, frozenset({"z"})),  # g3: nobody without z -> exposure, no difference
    ]
    evidence = utility_evidence(episodes)
    assert evidence["x"] == (pytest.approx((0.5 * 2 - 1.0 * 1) / 3), 3)
    assert evidence["y"] == (pytest.approx(-1.0), 1)
    assert evidence["z"] == (None, 1)
    assert admission.exponential_average(0.0, -1.0, 0.2) == pytest.approx(-0.2)
    assert admission.should_prune(-0.2, 8, 8, 0.0) and not admission.should_prune(-0.2, 7, 8, 0.0)


LESSONS = [  # distinct enough that none merges with another (checked below)
    "Open the fridge before looking for cold items.",
    "Slice the bread with a knife from the drawer.",
    "Turn on the desk lamp to examine small objects.",
    "Put clean plates back into the cabinet.",
]


def test_capacity_replace_the_minimum_reject_below_and_exact_counters(embedder):
    library = Library(library_config(), embedder)  # capacity 2 per level
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


def test_duplicates_merge_keeping_the_higher_score(embedder):
    library = Library(library_config(), embedder)
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


def test_rate_limit_rejects_beyond_the_window_quota(embedder):
    library = Library(library_config(), embedder)
    report = library.admit([candidate(LESSONS[0], 0.9), candidate(LESSONS[1], 0.8, level="example")], {STRATEGY: 1})
    assert len(report.admitted) == 1 and report.rejected == [(STRATEGY, "rate_limit")]
    assert library.experiences[report.admitted[0]].score == 0.9  # best first


def test_utility_pruning_after_enough_exposures(embedder):
    library = Library(library_config(prune_min_exposures=4, utility_rate=0.5), embedder)
    quota = {STRATEGY: 10}
    good, bad = library.admit([candidate(LESSONS[0], 0.5), candidate(LESSONS[1], 0.5)], quota).admitted
    assert library.apply_utility({good: (0.5, 2), bad: (-1.0, 2)}, {good: 6, bad: 3}) == []  # 2 exposures: too few
    assert library.experiences[bad].utility == pytest.approx(-0.5)
    assert [e.id for e in library.apply_utility({good: (0.5, 2), bad: (-1.0, 2)}, {})] == [bad]
    assert library.experiences[good].utility == pytest.approx(0.375) and library.experiences[good].usage == 6
    assert library.counters["pruned"] == 1
    assert library.apply_utility({bad: (1.0, 5)}, {}) == []  # gone items are skipped, not resurrected


def test_every_commit_bumps_the_version_once(embedder):
    library = Library(library_config(), embedder)
    assert library.commit() is None and library.version == 0
    library.admit([candidate(LESSONS[0], 0.5)], {STRATEGY: 1})
    delta = library.commit()
    assert (delta["from_version"], delta["version"], library.version) == (0, 1, 1)
    assert len(delta["experiences"]) == 1 and len(delta["clusters"]) == 1
    assert library.commit() is None
