"""Observation clusters: exact structural key first, else the nearest centroid by embedding.

One `TaskClusters` per task type (states of different tasks never share a cluster). A cluster's
centroid is the embedding of the observation that founded it and never moves ("leader"
clustering): a running mean would drift until early members no longer match, and a fixed
centroid means a cluster is published once, not on every visit. The number of clusters is
bounded; beyond it the least recently used one is evicted, and the caller unindexes the
experiences that pointed to it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import hnswlib
import numpy as np

from library.cluster_key import structural_key
from library.experience import decode_vector, encode_vector


@dataclass
class Cluster:
    """A set of observations the library treats as one state."""

    id: str  # "<task_type>/c<n>", unique across the library
    task_type: str  # the task type whose observations it groups
    key: str  # structural key of the founding observation
    representative: str  # the founding observation, as seen
    centroid: np.ndarray  # float32 [dim] unit vector of `representative`
    visits: int = 0  # observations assigned to it (founding included)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "task_type": self.task_type,
            "key": self.key,
            "representative": self.representative,
            "visits": self.visits,
            "centroid": encode_vector(self.centroid),
        }

    @classmethod
    def from_json(cls, record: dict) -> Cluster:
        return cls(**{**record, "centroid": decode_vector(record["centroid"])})


class TaskClusters:
    """The clusters of one task type: key map, hnswlib index over centroids, LRU order."""

    def __init__(self, task_type: str, dim: int, max_clusters: int, delta: float, group_instance_numbers: bool):
        self.task_type = task_type
        self.max_clusters = max_clusters
        self.delta = delta
        self.group_instance_numbers = group_instance_numbers
        self.by_id: OrderedDict[str, Cluster] = OrderedDict()  # least recently used first
        self.by_key: dict[str, str] = {}
        self._labels: dict[str, int] = {}  # cluster id -> hnswlib label
        self._ids: dict[int, str] = {}  # hnswlib label -> cluster id
        self._next_label = 0
        self._index = hnswlib.Index(space="ip", dim=dim)  # unit vectors: inner product = cosine
        self._index.init_index(
            max_elements=min(max_clusters, 1024), ef_construction=100, M=16, allow_replace_deleted=True
        )
        self._index.set_ef(64)

    def __len__(self) -> int:
        return len(self.by_id)

    def key_of(self, observation: str) -> str:
        return structural_key(observation, self.group_instance_numbers)

    def find(self, observation: str, embedding: np.ndarray | None) -> Cluster | None:
        """The cluster of an observation without changing anything (retrieval is read-only):
        exact key, else the nearest centroid if its cosine reaches delta; None when neither."""
        cluster_id = self.by_key.get(self.key_of(observation))
        if cluster_id is not None:
            return self.by_id[cluster_id]
        if embedding is None or not self.by_id:
            return None
        labels, distances = self._index.knn_query(embedding, k=1)
        cosine = 1.0 - float(distances[0][0])  # hnswlib "ip" distance is 1 - inner product
        if cosine >= self.delta:
            return self.by_id[self._ids[int(labels[0][0])]]
        return None

    def needs_embedding(self, observation: str) -> bool:
        return self.key_of(observation) not in self.by_key

    def assign(
        self, observation: str, embedding: np.ndarray | None, new_id: str
    ) -> tuple[Cluster, bool, list[Cluster]]:
        """Put an observation in a cluster, founding one with `new_id` if none matches.

        Returns (cluster, founded, evicted clusters). A visit makes the cluster most recently used."""
        cluster = self.find(observation, embedding)
        evicted: list[Cluster] = []
        founded = cluster is None
        if founded:
            if embedding is None:
                raise ValueError("founding a cluster needs the observation's embedding")
            while len(self.by_id) >= self.max_clusters:
                evicted.append(self.remove(next(iter(self.by_id))))
            cluster = Cluster(new_id, self.task_type, self.key_of(observation), observation, embedding)
            self.add(cluster)
        cluster.visits += 1
        self.by_id.move_to_end(cluster.id)
        return cluster, founded, evicted

    def add(self, cluster: Cluster) -> None:
        """Index a cluster (founded here, restored from a snapshot, or published by the writer)."""
        if cluster.id in self.by_id:
            self.remove(cluster.id)
        label = self._next_label
        self._next_label += 1
        if self._index.get_current_count() >= self._index.get_max_elements() and not self._index_has_deleted():
            self._index.resize_index(2 * self._index.get_max_elements())
        self._index.add_items(cluster.centroid[None, :], [label], replace_deleted=True)
        self.by_id[cluster.id] = cluster
        self.by_key.setdefault(cluster.key, cluster.id)
        self._labels[cluster.id] = label
        self._ids[label] = cluster.id

    def _index_has_deleted(self) -> bool:
        return self._index.get_current_count() > len(self.by_id)

    def remove(self, cluster_id: str) -> Cluster:
        cluster = self.by_id.pop(cluster_id)
        if self.by_key.get(cluster.key) == cluster_id:
            del self.by_key[cluster.key]
        label = self._labels.pop(cluster_id)
        del self._ids[label]
        self._index.mark_deleted(label)
        return cluster
