"""The words a generated WebShop catalogue is made of: WebShop's five top-level categories
(beauty, food, fashion, furniture, electronics), their product types, attribute pools and
option pools. Plain data, so a reader can see at a glance what the shop sells."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProductType:
    """One kind of product, the unit WebShop scraped by ("query")."""

    name: str  # noun phrase used in titles and instructions, e.g. "running shoe"
    subcategory: str  # second level of the category path, e.g. "Shoes"
    option_dims: tuple[str, ...]  # option dimensions this product offers, e.g. ("color", "size")


@dataclass(frozen=True)
class Category:
    """A top-level category: the task type of the instructions drawn from it."""

    key: str  # task type name, e.g. "fashion"
    path_root: str  # first level of the Amazon-style category path
    product_types: tuple[ProductType, ...]  # kinds of products sold here
    attributes: tuple[str, ...]  # attribute pool; a product has 2-4, an instruction asks for 1-3
    options: dict[str, tuple[str, ...]]  # option dimension -> values a product may offer
    price_range: tuple[float, float]  # dollars, lowest and highest list price
    title_words: tuple[str, ...]  # marketing words that pad titles, as real listings do


BRANDS = (
    "Kelvo",
    "Aurendi",
    "Brisko",
    "Calloway",
    "Dunmere",
    "Everlo",
    "Fenwick",
    "Galvia",
    "Harlow",
    "Istra",
    "Joviel",
    "Korrin",
    "Lumeo",
    "Mavrik",
    "Nordell",
    "Orvia",
    "Pellam",
    "Quintara",
    "Rosco",
    "Sallow",
    "Tavren",
    "Ulmo",
    "Vestra",
    "Wexley",
    "Yarrow",
    "Zephra",
)

CATEGORIES = (
    Category(
        key="beauty",
        path_root="Beauty & Personal Care",
        product_types=(
            ProductType("hair extension", "Hair Care", ("color", "size")),
            ProductType("shampoo", "Hair Care", ("scent", "size")),
            ProductType("face moisturizer", "Skin Care", ("size",)),
            ProductType("body lotion", "Skin Care", ("scent", "size")),
            ProductType("lipstick", "Makeup", ("color",)),
            ProductType("nail polish", "Makeup", ("color", "count")),
            ProductType("eyeshadow palette", "Makeup", ("color",)),
            ProductType("electric toothbrush", "Oral Care", ("color", "count")),
        ),
        attributes=(
            "long lasting",
            "cruelty free",
            "paraben free",
            "natural ingredients",
            "sensitive skin",
            "easy to use",
            "travel size",
            "dermatologist tested",
            "vegan formula",
            "fragrance free",
        ),
        options={
            "color": ("natural black", "dark brown", "honey blonde", "burgundy", "nude", "rose pink", "coral red"),
            "scent": ("lavender", "coconut", "unscented", "citrus", "vanilla bean", "eucalyptus"),
            "size": ("1 fl oz", "3.4 fl oz", "8 fl oz", "16 fl oz", "32 fl oz"),
            "count": ("pack of 1", "pack of 2", "pack of 3", "pack of 4"),
        },
        price_range=(4.0, 60.0),
        title_words=("Professional", "Premium", "Salon Quality", "Daily", "Gentle", "Luxury"),
    ),
    Category(
        key="food",
        path_root="Grocery & Gourmet Food",
        product_types=(
            ProductType("protein bar", "Snacks", ("flavor", "count")),
            ProductType("trail mix", "Snacks", ("flavor", "size")),
            ProductType("green tea", "Beverages", ("flavor", "count")),
            ProductType("coffee beans", "Beverages", ("flavor", "size")),
            ProductType("dark chocolate", "Candy", ("flavor", "count")),
            ProductType("olive oil", "Pantry", ("size",)),
            ProductType("pasta sauce", "Pantry", ("flavor", "count")),
            ProductType("granola", "Breakfast", ("flavor", "size")),
        ),
        attributes=(
            "gluten free",
            "low sugar",
            "non gmo",
            "keto friendly",
            "usda organic",
            "high protein",
            "dairy free",
            "sugar free",
            "plant based",
            "kosher certified",
        ),
        options={
            "flavor": (
                "chocolate",
                "vanilla",
                "peanut butter",
                "mixed berry",
                "sea salt",
                "original",
                "mint",
                "salted caramel",
            ),
            "size": ("8 ounce", "12 ounce", "16 ounce", "2 pound", "5 pound"),
            "count": ("pack of 6", "pack of 12", "pack of 18", "pack of 24"),
        },
        price_range=(3.0, 45.0),
        title_words=("Gourmet", "Classic", "Artisan", "Family Size", "Healthy", "Fresh"),
    ),
    Category(
        key="fashion",
        path_root="Clothing, Shoes & Jewelry",
        product_types=(
            ProductType("running shoe", "Shoes", ("color", "shoe size")),
            ProductType("ankle boot", "Shoes", ("color", "shoe size")),
            ProductType("hoodie", "Clothing", ("color", "size")),
            ProductType("crew neck shirt", "Clothing", ("color", "size")),
            ProductType("slim fit jeans", "Clothing", ("color", "size")),
            ProductType("rain jacket", "Clothing", ("color", "size")),
            ProductType("yoga pants", "Clothing", ("color", "size")),
            ProductType("baseball cap", "Accessories", ("color",)),
        ),
        attributes=(
            "machine wash",
            "long sleeve",
            "slip resistant",
            "water resistant",
            "relaxed fit",
            "moisture wicking",
            "button closure",
            "elastic waist",
            "lightweight",
            "quick drying",
        ),
        options={
            "color": ("black", "white", "navy blue", "heather grey", "olive green", "burgundy", "khaki", "light blue"),
            "size": ("x-small", "small", "medium", "large", "x-large", "xx-large"),
            "shoe size": ("6", "7", "8", "9", "10", "11", "12"),
        },
        price_range=(9.0, 120.0),
        title_words=("Men's", "Women's", "Unisex", "Classic", "Casual", "Athletic"),
    ),
    Category(
        key="furniture",
        path_root="Home & Kitchen",
        product_types=(
            ProductType("office chair", "Furniture", ("color",)),
            ProductType("bookshelf", "Furniture", ("color", "size")),
            ProductType("coffee table", "Furniture", ("color", "size")),
            ProductType("bar stool", "Furniture", ("color", "count")),
            ProductType("nightstand", "Furniture", ("color", "count")),
            ProductType("tv stand", "Furniture", ("color", "size")),
            ProductType("storage ottoman", "Furniture", ("color", "size")),
            ProductType("standing desk", "Furniture", ("color", "size")),
        ),
        attributes=(
            "easy assembly",
            "solid wood",
            "space saving",
            "height adjustable",
            "mid century",
            "living room",
            "storage space",
            "metal frame",
            "faux leather",
            "engineered wood",
        ),
        options={
            "color": ("espresso", "walnut", "white oak", "charcoal", "grey", "natural wood", "ivory"),
            "size": ("24 inch", "32 inch", "40 inch", "48 inch", "60 inch"),
            "count": ("set of 1", "set of 2", "set of 4"),
        },
        price_range=(30.0, 400.0),
        title_words=("Modern", "Rustic", "Industrial", "Contemporary", "Farmhouse", "Compact"),
    ),
    Category(
        key="electronics",
        path_root="Electronics",
        product_types=(
            ProductType("wireless earbuds", "Headphones", ("color",)),
            ProductType("bluetooth speaker", "Portable Audio", ("color",)),
            ProductType("phone case", "Cell Phone Accessories", ("color", "phone model")),
            ProductType("usb c cable", "Cables", ("color", "length")),
            ProductType("hdmi cable", "Cables", ("length", "count")),
            ProductType("power bank", "Cell Phone Accessories", ("color", "capacity")),
            ProductType("smart watch", "Wearable Technology", ("color",)),
            ProductType("laptop stand", "Computer Accessories", ("color",)),
        ),
        attributes=(
            "fast charging",
            "noise cancelling",
            "water resistant",
            "long battery life",
            "high definition",
            "easy to carry",
            "wireless charging",
            "usb port",
            "hands free",
            "aluminum alloy",
        ),
        options={
            "color": ("black", "white", "silver", "space grey", "midnight blue", "red"),
            "phone model": ("iphone 15", "iphone 14", "galaxy s24", "galaxy s23", "pixel 8"),
            "length": ("3 ft", "6 ft", "10 ft", "15 ft"),
            "count": ("1 pack", "2 pack", "3 pack"),
            "capacity": ("5000mah", "10000mah", "20000mah", "26800mah"),
        },
        price_range=(7.0, 250.0),
        title_words=("Upgraded", "Portable", "Ultra Slim", "Heavy Duty", "2024 Edition", "Pro"),
    ),
)
