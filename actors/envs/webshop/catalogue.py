"""A generated product catalogue in WebShop's shape (Yao et al. 2022 scraped ~1.2M Amazon
listings; here a seeded generator writes them, so the shop exists offline and is identical on
every machine). Products of one type share a vocabulary, so instructions must be read closely:
several hoodies exist, only some are lightweight, navy blue and under the price bound."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from actors.envs.webshop.vocabulary import BRANDS, CATEGORIES, Category, ProductType

DEFAULT_CATALOGUE_SEED = 2022
DEFAULT_NUM_PRODUCTS = 1200


@dataclass(frozen=True)
class Product:
    """One listing, with the fields WebShop's reward reads."""

    asin: str  # Amazon-style id, e.g. "B07K3XQ9ZT"; clicked in lower case on result pages
    title: str  # listing title shown on result and item pages
    category: str  # task type key, e.g. "fashion"
    category_path: str  # "Clothing, Shoes & Jewelry › Shoes › running shoe" (WebShop's product_category)
    product_type: str  # the query WebShop scraped this product by, e.g. "running shoe"
    attributes: tuple[str, ...]  # attribute phrases the product has, e.g. ("slip resistant", "lightweight")
    options: dict[str, tuple[str, ...]]  # option dimension -> offered values, e.g. {"color": ("black", "khaki")}
    price: float  # dollars
    description: str  # paragraph on the Description page
    features: tuple[str, ...]  # bullet points on the Features page (WebShop's BulletPoints)

    def searchable_text(self) -> str:
        """What the search engine indexes: everything a shopper could match words against."""
        option_words = " ".join(value for values in self.options.values() for value in values)
        return " ".join([self.title, self.description, " ".join(self.features), option_words])


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))


def _title(
    rng: random.Random, brand: str, category: Category, product_type: ProductType, attributes: tuple[str, ...]
) -> str:
    # Real titles name the brand, a marketing word, the type and one or two selling points.
    shown = ", ".join(attribute.title() for attribute in attributes[: rng.randint(1, 2)])
    return f"{brand} {rng.choice(category.title_words)} {product_type.name.title()} - {shown}"


def _description(brand: str, product_type: ProductType, attributes: tuple[str, ...]) -> str:
    return (
        f"The {brand} {product_type.name} is made for everyday use. "
        f"Highlights: {', '.join(attributes)}. Backed by a 30 day return policy."
    )


def _features(
    product_type: ProductType, attributes: tuple[str, ...], options: dict[str, tuple[str, ...]]
) -> tuple[str, ...]:
    bullets = [f"{attribute.upper()}: one reason shoppers choose this {product_type.name}." for attribute in attributes]
    bullets += [f"AVAILABLE {dim.upper()}: {', '.join(values)}." for dim, values in options.items()]
    return tuple(bullets)


def _make_product(rng: random.Random, category: Category, asins: set[str]) -> Product:
    product_type = rng.choice(category.product_types)
    brand = rng.choice(BRANDS)
    attributes = tuple(rng.sample(category.attributes, k=rng.randint(2, 4)))
    options = {}
    for dim in product_type.option_dims:
        pool = category.options[dim]
        options[dim] = tuple(sorted(rng.sample(pool, k=rng.randint(2, min(5, len(pool)))), key=pool.index))
    low, high = category.price_range
    price = round(rng.uniform(low, high)) - 0.01 if rng.random() < 0.7 else round(rng.uniform(low, high), 2)
    asin = _asin(rng)
    while asin in asins:
        asin = _asin(rng)
    asins.add(asin)
    return Product(
        asin=asin,
        title=_title(rng, brand, category, product_type, attributes),
        category=category.key,
        category_path=f"{category.path_root} › {product_type.subcategory} › {product_type.name}",
        product_type=product_type.name,
        attributes=attributes,
        options=options,
        price=max(price, 0.99),
        description=_description(brand, product_type, attributes),
        features=_features(product_type, attributes, options),
    )


def generate_catalogue(seed: int = DEFAULT_CATALOGUE_SEED, num_products: int = DEFAULT_NUM_PRODUCTS) -> list[Product]:
    """`num_products` listings spread evenly over the categories, the same for the same seed."""
    rng = random.Random(seed)
    asins: set[str] = set()
    return [_make_product(rng, CATEGORIES[index % len(CATEGORIES)], asins) for index in range(num_products)]
