"""Snapshots: a restored library answers exactly as before; `library show` reads them."""

import json

import pytest
from library_helpers import candidate, library_config

from library.admission import Evidence
from library.experience import STRATEGY, WARNING
from library.persistence import (
    latest_snapshot,
    load_snapshot_text,
    show_library,
    snapshot_text,
    utility_label,
    write_snapshot,
)
from library.retrieval import retrieve_batch
from library.state import Library

OBSERVATIONS = [
    "You arrive at fridge 1. The fridge 1 is closed.",
    "You arrive at sinkbasin 1. You see a sponge 2.",
    "You are in a garden you have never seen.",
]


def test_restored_library_answers_the_same(embedder, policy_tokenizer, tmp_path):
    cfg = library_config(prune_utility_at_or_below=-0.05)  # so the one window below counts as low
    library = Library(cfg, embedder, policy_tokenizer)
    library.admit(
        [
            candidate("Open the fridge before looking inside it.", 0.9, observation=OBSERVATIONS[0]),
            candidate("Rinse the sponge in the sink.", 0.5, observation=OBSERVATIONS[1]),
            candidate(
                "Never put the sponge in the fridge.", 0.7, zone=WARNING, level="mistake", observation=OBSERVATIONS[0]
            ),
        ],
        {STRATEGY: 10, WARNING: 5},
    )
    library.apply_utility({next(iter(library.experiences)): Evidence(exposures=3, gain=-0.5, compared=2)}, {})
    library.commit()
    write_snapshot(tmp_path, snapshot_text(library, ["ep-1"]), library.version)
    text = latest_snapshot(tmp_path).read_text()
    header = json.loads(text.splitlines()[0])
    assert header["version"] == 1 and header["applied_episodes"] == ["ep-1"] and header["experiences"] == 3
    restored = Library(cfg, embedder)
    load_snapshot_text(restored, text)
    assert restored.counters == library.counters and restored.next_id == library.next_id
    evolution = {e.id: (e.utility, e.exposures, e.compared, e.low_windows) for e in library.experiences.values()}
    assert {
        e.id: (e.utility, e.exposures, e.compared, e.low_windows) for e in restored.experiences.values()
    } == evolution
    assert sorted(evolution.values())[0] == (pytest.approx(-0.1), 3, 2, 1)  # 0.2 * -0.5, at or below -0.05 once
    tasks = ["pick"] * len(OBSERVATIONS)
    assert retrieve_batch(restored, OBSERVATIONS, tasks) == retrieve_batch(library, OBSERVATIONS, tasks)


def test_only_the_newest_snapshots_are_kept(tmp_path):
    for version in range(1, 6):
        write_snapshot(tmp_path, json.dumps({"kind": "header"}) + "\n", version)
    assert sorted(path.name for path in (tmp_path / "library" / "snapshots").iterdir()) == [
        "v000000003.jsonl",
        "v000000004.jsonl",
        "v000000005.jsonl",
    ]


def test_show_library(embedder, policy_tokenizer, tmp_path):
    assert "no library snapshot yet" in show_library(tmp_path)
    library = Library(library_config(), embedder, policy_tokenizer)
    library.admit(
        [candidate("Open the fridge before looking inside it.", 0.9, observation=OBSERVATIONS[0])], {STRATEGY: 1}
    )
    library.commit()
    write_snapshot(tmp_path, snapshot_text(library, []), library.version)
    shown = show_library(tmp_path)
    assert "version 1" in shown and "experiences 1  clusters 1" in shown and "pick 1" in shown
    assert (
        "  method: 1" in shown
        and "Open the fridge before looking inside it." in shown
        and "warning zone: 0 items" in shown
    )
    assert "      from episodes: ep" in shown  # the episode the item was distilled from
    assert "utility - (no A/B evidence)" in shown  # no A/B group has compared it


def test_utility_label_names_the_ab_sample_behind_a_utility():
    assert utility_label({"utility": -0.1, "compared": 2}) == "utility -0.10 over 2 A/B"
    # unmoved: a run without A/B groups (every preset but run.edge) never compares an item
    assert utility_label({"utility": 0.0, "compared": 0}) == "utility - (no A/B evidence)"
    assert utility_label({"utility": 0.0}) == "utility - (no A/B evidence)"  # a snapshot from before `compared`
