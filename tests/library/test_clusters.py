"""Clustering with the real MiniLM embeddings."""

import numpy as np

from library.clusters import TaskClusters

KITCHEN = "You are in the kitchen. On the countertop 1, you see an apple 1, a knife 2 and a bread 1."
KITCHEN_NEAR = "You are in the kitchen. On the countertop 1, you see an apple 1, a knife 1 and a bread 1."
BATHROOM = "You are in the bathroom. You see a toilet 1, a sinkbasin 1 and a towelholder 1 with a towel."


def clusters(embedder, delta=0.85, max_clusters=100, group=False):
    return TaskClusters("pick", embedder.dim, max_clusters, delta, group)


def assign(space, embedder, observation, new_id):
    vector = embedder.embed([observation])[0] if space.needs_embedding(observation) else None
    return space.assign(observation, vector, new_id)


def test_identical_and_near_identical_share_a_cluster_different_rooms_do_not(embedder):
    space = clusters(embedder)
    first, founded, _ = assign(space, embedder, KITCHEN, "pick/c0")
    assert founded
    assert (
        assign(
            space,
            embedder,
            "  you are in the KITCHEN. on the countertop 1, you see an apple 1, a knife 2 and a bread 1.",
            "pick/c1",
        )[0]
        is first
    )  # same structural key: no embedding needed
    assert float(embedder.embed([KITCHEN])[0] @ embedder.embed([KITCHEN_NEAR])[0]) >= 0.85
    assert assign(space, embedder, KITCHEN_NEAR, "pick/c1")[0] is first
    other, founded, _ = assign(space, embedder, BATHROOM, "pick/c1")
    assert founded and other.id == "pick/c1"
    assert first.visits == 3 and len(space) == 2


def test_delta_is_respected(embedder):
    similarity = float(embedder.embed([KITCHEN])[0] @ embedder.embed([KITCHEN_NEAR])[0])
    strict = clusters(embedder, delta=similarity + 1e-3)
    loose = clusters(embedder, delta=similarity - 1e-3)
    for space in (strict, loose):
        assign(space, embedder, KITCHEN, "pick/c0")
    assert assign(strict, embedder, KITCHEN_NEAR, "pick/c1")[1] is True
    assert assign(loose, embedder, KITCHEN_NEAR, "pick/c1")[1] is False


def test_instance_numbers_grouped_by_key_when_configured(embedder):
    space = clusters(embedder, delta=1.0, group=True)  # delta 1.0: only the key can join them
    first, _, _ = assign(space, embedder, "You are at drawer 1. It is closed.", "pick/c0")
    assert space.find("You are at drawer 7. It is closed.", None) is first


def test_least_recently_used_cluster_is_evicted(embedder):
    space = clusters(embedder, max_clusters=2)
    assign(space, embedder, KITCHEN, "pick/c0")
    assign(space, embedder, BATHROOM, "pick/c1")
    assign(space, embedder, KITCHEN, "pick/c2")  # kitchen used again: bathroom is now the least used
    garden = "You are in the garden. A hose 1 lies next to a flowerbed 1."
    cluster, founded, evicted = assign(space, embedder, garden, "pick/c2")
    assert founded and [gone.id for gone in evicted] == ["pick/c1"]
    assert set(space.by_id) == {"pick/c0", "pick/c2"}
    assert space.find(BATHROOM, embedder.embed([BATHROOM])[0]) is None
    assert space.find(garden, None) is cluster


def test_index_grows_past_its_initial_size_and_reuses_deleted_slots():
    rng = np.random.default_rng(0)
    space = TaskClusters("pick", 8, max_clusters=1500, delta=0.999, group_instance_numbers=False)
    vectors = rng.standard_normal((1600, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for index, vector in enumerate(vectors):
        space.assign(f"state {index}", vector, f"pick/c{index}")
    assert len(space) == 1500
    assert space.find("unseen", vectors[-1]).id == "pick/c1599"
