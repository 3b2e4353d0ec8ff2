"""WebShop's pages as text: what the agent sees on each page and what it can click.

The format follows WebShop's text observation: page elements joined by " [SEP] ", clickable
elements marked "[button] ... [button_]" and a chosen option "[clicked button] ... [clicked button_]"
(WebShop's text_rich markers), clicked by their lower-cased label, e.g. click[b07k3xq9zt].
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.envs.webshop.catalogue import Product
from actors.envs.webshop.shop import Shop

RESULTS_PER_PAGE = 10
BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
DESCRIPTION = "description"
FEATURES = "features"
BUY_NOW = "buy now"


@dataclass
class PageState:
    """Where the shopper is; everything an observation is rendered from."""

    kind: str = "search"  # "search", "results", "item", "description" or "features"
    query: str = ""  # the last search query
    results: list[str] = field(default_factory=list)  # asins the last search returned, best first
    page_number: int = 1  # results page shown (1-based), also where "< prev" on an item returns to
    asin: str = ""  # the item open on item/description/features pages
    selected: dict[str, str] = field(default_factory=dict)  # option dimension -> chosen value of the open item

    def last_page_number(self) -> int:
        return max(1, -(-len(self.results) // RESULTS_PER_PAGE))


@dataclass(frozen=True)
class RenderedPage:
    """One page as the agent sees it."""

    text: str  # " [SEP] "-joined page elements
    clickables: list[str]  # lower-cased labels click[...] accepts here
    has_search_bar: bool  # search[...] is accepted (search page only, as in WebShop)


def _button(label: str) -> str:
    return f"[button] {label} [button_]"


def _search_page(instruction: str) -> RenderedPage:
    text = " [SEP] ".join(["WebShop", "Instruction:", instruction, _button("Search")])
    return RenderedPage(text=text, clickables=[], has_search_bar=True)


def _results_page(state: PageState, shop: Shop) -> RenderedPage:
    first = (state.page_number - 1) * RESULTS_PER_PAGE
    shown = [shop.by_asin[asin] for asin in state.results[first : first + RESULTS_PER_PAGE]]
    elements = [_button("Back to Search"), f"Page {state.page_number} (Total results: {len(state.results)})"]
    clickables = [BACK_TO_SEARCH]
    if state.page_number > 1:
        elements.append(_button("< Prev"))
        clickables.append(PREV_PAGE)
    if state.page_number < state.last_page_number():
        elements.append(_button("Next >"))
        clickables.append(NEXT_PAGE)
    for product in shown:
        elements += [_button(product.asin), product.title, f"${product.price:.2f}"]
        clickables.append(product.asin.lower())
    return RenderedPage(text=" [SEP] ".join(elements), clickables=clickables, has_search_bar=False)


def _item_page(state: PageState, product: Product) -> RenderedPage:
    elements = [_button("Back to Search"), _button("< Prev")]
    clickables = [BACK_TO_SEARCH, PREV_PAGE]
    for dim, values in product.options.items():
        elements.append(dim)
        for value in values:
            chosen = state.selected.get(dim) == value
            elements.append(f"[clicked button] {value} [clicked button_]" if chosen else _button(value))
            clickables.append(value)
    elements += [
        product.title,
        f"Price: ${product.price:.2f}",
        "Rating: N.A.",
        _button("Description"),
        _button("Features"),
        _button("Buy Now"),
    ]
    clickables += [DESCRIPTION, FEATURES, BUY_NOW]
    return RenderedPage(text=" [SEP] ".join(elements), clickables=clickables, has_search_bar=False)


def _detail_page(product: Product, kind: str) -> RenderedPage:
    body = [product.description] if kind == DESCRIPTION else list(product.features)
    text = " [SEP] ".join([_button("Back to Search"), _button("< Prev"), *body])
    return RenderedPage(text=text, clickables=[BACK_TO_SEARCH, PREV_PAGE], has_search_bar=False)


def render_page(state: PageState, shop: Shop, instruction: str) -> RenderedPage:
    if state.kind == "search":
        return _search_page(instruction)
    if state.kind == "results":
        return _results_page(state, shop)
    product = shop.by_asin[state.asin]
    if state.kind == "item":
        return _item_page(state, product)
    return _detail_page(product, state.kind)
