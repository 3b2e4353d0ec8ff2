"""The shop an env instance browses: the catalogue, an asin index and BM25 search over it
(bm25s, as WebShop used a BM25 engine, Pyserini). Built once per (seed, size) per process and
shared by every env instance, since an env must be cheap to create and reset."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import bm25s

from actors.envs.webshop.catalogue import Product, generate_catalogue

RESULTS_PER_SEARCH = 50  # WebShop shows the top 50 hits, 10 per page


@dataclass(frozen=True)
class Shop:
    """A catalogue and its search index."""

    products: list[Product]  # every listing, in generation order
    by_asin: dict[str, Product]  # upper-case asin -> listing
    index: bm25s.BM25  # BM25 index over Product.searchable_text(), document i = products[i]

    def search(self, query: str, limit: int = RESULTS_PER_SEARCH) -> list[Product]:
        """The `limit` best listings for `query`; like WebShop, a query always returns a full page list."""
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        known = [token for token in tokens if token in self.index.vocab_dict]
        if not known:  # nothing in the query occurs in the shop: every listing scores 0, list them in order
            return self.products[:limit]
        documents, _ = self.index.retrieve([known], k=min(limit, len(self.products)), show_progress=False)
        return [self.products[int(i)] for i in documents[0]]


@functools.lru_cache(maxsize=4)
def load_shop(seed: int, num_products: int) -> Shop:
    products = generate_catalogue(seed, num_products)
    index = bm25s.BM25()
    corpus_tokens = bm25s.tokenize(
        [product.searchable_text() for product in products], stopwords="en", show_progress=False
    )
    index.index(corpus_tokens, show_progress=False)
    return Shop(products=products, by_asin={product.asin: product for product in products}, index=index)
