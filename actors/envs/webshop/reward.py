"""WebShop's purchase reward (web_agent_site/engine/goal.py: get_reward), reproduced term by term.

    reward = r_type * (attribute matches + option matches + [price ok]) / (#attributes + #options + 1)

Two substitutions keep it offline and dependency-free: WebShop's `fuzz.token_set_ratio > 85`
becomes "one token set contains the other" (token_set_ratio is 100 exactly then, and our
generated vocabulary has no misspellings to be lenient about), and spaCy's noun extraction
from titles becomes the product type's words (the generator knows which words name the type).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from actors.envs.webshop.catalogue import Product
from actors.envs.webshop.goals import Goal

_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class PurchaseReward:
    """The reward of one purchase and the parts it is made of (reported in step info)."""

    total: float  # the reward in [0, 1]; 1.0 is a perfect purchase (= success)
    r_type: float  # type multiplier: 1.0 same kind of product, 0.5 / 0.1 / 0.0 less and less alike
    r_attribute: float  # fraction of asked attributes the product has
    r_option: float | None  # fraction of asked option values selected (None when none were asked)
    r_price: bool  # price within the bound


def _tokens(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _token_set_match(left: str, right: str) -> bool:
    left_tokens, right_tokens = _tokens(left), _tokens(right)
    return bool(left_tokens and right_tokens) and (left_tokens <= right_tokens or right_tokens <= left_tokens)


def type_reward(product: Product, goal: Goal) -> float:
    """WebShop's get_type_reward: same query or category, else how much of the type name the title shares."""
    query_match = product.product_type == goal.product_type
    shared_levels = {level.strip() for level in product.category_path.split("›")} & {
        level.strip() for level in goal.category_path.split("›")
    }
    category_match = len(shared_levels) >= 2
    desired_type_words = _tokens(goal.product_type)
    title_score = len(_tokens(product.product_type) & desired_type_words) / len(desired_type_words)
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def attribute_matches(product: Product, goal: Goal) -> int:
    """Asked attributes found among the product's attributes, else anywhere in its title, bullets or description."""
    text = " ".join([product.title, " ".join(product.features), product.description]).lower()
    return sum(
        any(_token_set_match(have, wanted) for have in product.attributes) or wanted in text
        for wanted in goal.attributes
    )


def option_matches(selected: dict[str, str], goal: Goal) -> int:
    """Asked option values that match a selected value (dimension names are not compared, as in WebShop)."""
    return sum(
        any(_token_set_match(chosen, wanted) for chosen in selected.values()) for wanted in goal.options.values()
    )


def purchase_reward(product: Product, selected: dict[str, str], goal: Goal) -> PurchaseReward:
    r_type = type_reward(product, goal)
    n_attributes = attribute_matches(product, goal)
    n_options = option_matches(selected, goal)
    r_price = product.price <= goal.price_upper
    total = (n_attributes + n_options + r_price) / (len(goal.attributes) + len(goal.options) + 1) * r_type
    return PurchaseReward(
        total=total,
        r_type=r_type,
        r_attribute=n_attributes / len(goal.attributes),
        r_option=n_options / len(goal.options) if goal.options else None,
        r_price=r_price,
    )
