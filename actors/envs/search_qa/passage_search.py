"""BM25 retrieval over the knowledge base's passages (bm25s), the retriever search[query] calls.
Search-R1 and the SLEA-RL search tasks retrieve the top 3 passages per query; so do we."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import bm25s
import numpy as np

from actors.envs.search_qa.knowledge_base import KnowledgeBase, Passage, load_knowledge_base

TOP_K = 3


@dataclass(frozen=True)
class PassageSearch:
    """A knowledge base and its BM25 index."""

    kb: KnowledgeBase  # the world the passages describe
    index: bm25s.BM25  # document i = kb.passages[i], indexed as "title. text"

    def search(self, query: str, k: int = TOP_K) -> list[Passage]:
        """The k best passages; a query of only unknown words returns none (nothing matches).

        Ties go to the earlier passage, by an explicit stable order: bm25s's own top-k (numpy's
        argpartition/argsort) breaks ties by whichever SIMD sort the CPU runs (AVX512 and AVX2
        machines returned different passages for the same task), and a task must read the same on
        every machine. Scores are rounded to 5 decimals first, below any real difference of BM25
        weights and above float32 summation noise."""
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        known = [token for token in tokens if token in self.index.vocab_dict]
        if not known:
            return []
        scores = np.round(self.index.get_scores(known).astype(np.float64), 5)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]  # score descending, then passage index
        return [self.kb.passages[int(i)] for i in order if scores[i] > 0]


@functools.lru_cache(maxsize=4)
def load_passage_search(kb_seed: int) -> PassageSearch:
    kb = load_knowledge_base(kb_seed)
    index = bm25s.BM25()
    index.index(
        bm25s.tokenize([f"{p.title}. {p.text}" for p in kb.passages], stopwords="en", show_progress=False),
        show_progress=False,
    )
    return PassageSearch(kb=kb, index=index)
