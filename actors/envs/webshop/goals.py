"""WebShop instructions: a target product's type, some of its attributes, one value per option
dimension and a price bound, written as a shopper would ask (WebShop's goal format)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from actors.envs.webshop.catalogue import Product
from actors.envs.webshop.vocabulary import CATEGORIES

_TEMPLATES = (
    "i need {article} {attributes} {product_type}{options}, and price lower than {price} dollars",
    "i am looking for {article} {product_type} that is {attributes}{options}, and price lower than {price} dollars",
    "find me {article} {attributes} {product_type}{options}, and price lower than {price} dollars",
    "i want to buy {article} {product_type} which is {attributes}{options}, and price lower than {price} dollars",
)


@dataclass(frozen=True)
class Goal:
    """What the shopper wants; WebShop's reward compares the purchase against it."""

    instruction: str  # the task text shown to the agent
    category: str  # task type, e.g. "fashion"
    target_asin: str  # the product the goal was drawn from (a perfect purchase may be another match)
    product_type: str  # the query of the target, e.g. "running shoe"
    category_path: str  # the target's category path
    attributes: tuple[str, ...]  # attribute phrases asked for
    options: dict[str, str]  # option dimension -> value asked for
    price_upper: float  # dollars; the purchase must not cost more


def _options_phrase(options: dict[str, str]) -> str:
    if not options:
        return ""
    return " with " + ", and ".join(f"{dim}: {value}" for dim, value in options.items())


def build_goal(products: list[Product], seed: int) -> Goal:
    """The goal of task `seed`: a category, a product of it, and what to ask for about that product."""
    rng = random.Random(seed)
    category = rng.choice(CATEGORIES).key
    target = rng.choice([product for product in products if product.category == category])
    attributes = tuple(rng.sample(target.attributes, k=rng.randint(1, min(3, len(target.attributes)))))
    options = {dim: rng.choice(values) for dim, values in target.options.items()}
    price_upper = float(math.ceil(target.price * rng.uniform(1.05, 1.6) / 5) * 5)
    instruction = rng.choice(_TEMPLATES).format(
        article="an" if attributes[0][0] in "aeiou" else "a",
        attributes=" and ".join(attributes),
        product_type=target.product_type,
        options=_options_phrase(options),
        price=f"{price_upper:.2f}",
    )
    return Goal(
        instruction=instruction,
        category=category,
        target_asin=target.asin,
        product_type=target.product_type,
        category_path=target.category_path,
        attributes=attributes,
        options=options,
        price_upper=price_upper,
    )
