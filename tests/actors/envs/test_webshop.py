"""WebShop specifics: the catalogue, the page flow and the purchase reward."""

from __future__ import annotations

import time

from actors.envs.registry import make_env
from actors.envs.webshop.catalogue import generate_catalogue
from actors.envs.webshop.goals import build_goal
from actors.envs.webshop.reward import purchase_reward
from actors.envs.webshop.shop import load_shop
from actors.envs.webshop.vocabulary import CATEGORIES


def test_catalogue_is_large_varied_and_fast():
    started = time.perf_counter()
    shop = load_shop(seed=11, num_products=1200)  # a seed no other test uses: built here, not cached
    assert time.perf_counter() - started < 1.0
    products = shop.products
    assert len(products) >= 1000 and len(shop.by_asin) == len(products)
    assert {p.category for p in products} == {c.key for c in CATEGORIES}
    assert all(p.title and p.description and p.features and len(p.attributes) >= 2 and p.price > 0 for p in products)
    assert any("color" in p.options and "size" in p.options for p in products)
    assert generate_catalogue(11, 1200) == products


def test_page_flow_search_results_item_options_details():
    env = make_env("webshop")
    reset = env.reset(env.make_task(5, "train"))
    assert reset.observation.admissible_actions == ["search[<your query>]"]
    assert "Instruction:" in reset.observation.text
    results = env.step("search[hoodie]").observation
    assert "Page 1 (Total results: 50)" in results.text
    assert "click[next >]" in results.admissible_actions and "click[< prev]" not in results.admissible_actions
    assert sum(action.startswith("click[b0") for action in results.admissible_actions) == 10
    page_two = env.step("click[Next >]").observation
    assert "Page 2 (Total results: 50)" in page_two.text and "click[< prev]" in page_two.admissible_actions
    assert not env.step("search[shoe]").action_valid  # the search bar is only on the search page
    item_click = next(a for a in page_two.admissible_actions if a.startswith("click[b0"))
    item = env.step(item_click).observation
    assert "click[buy now]" in item.admissible_actions and "Price: $" in item.text
    option = item.admissible_actions[2]  # first option value after back-to-search and < prev
    clicked = env.step(option).observation
    assert f"[clicked button] {option[6:-1]} [clicked button_]" in clicked.text
    assert "Highlights:" in env.step("click[description]").observation.text
    assert env.step("click[< prev]").observation.anchor_obs == clicked.anchor_obs
    assert env.step("click[back to search]").observation.admissible_actions == ["search[<your query>]"]


def test_reward_matches_webshop_formula():
    shop = load_shop(2022, 1200)
    goal = build_goal(shop.products, seed=21)
    target = shop.by_asin[goal.target_asin]
    perfect = purchase_reward(target, dict(goal.options), goal)
    assert perfect.total == 1.0 and perfect.r_type == 1.0
    no_options = purchase_reward(target, {}, goal)
    n_attributes, n_options = len(goal.attributes), len(goal.options)
    assert no_options.total == (n_attributes + 0 + 1) / (n_attributes + n_options + 1)
    other_category = next(p for p in shop.products if p.category != goal.category)
    assert purchase_reward(other_category, dict(goal.options), goal).r_type == 0.0


def test_buying_ends_the_episode_with_reward_parts():
    env = make_env("webshop")
    env.reset(env.make_task(8, "train"))
    while True:
        outcome = env.step(env.expert_action())
        if outcome.done:
            break
    assert outcome.won and outcome.reward == 1.0
    assert outcome.info["reward_parts"]["r_price"] is True
    assert "Thank you for shopping with us!" in outcome.observation.text
    assert env.max_steps == 15 and not env.step("click[buy now]").action_valid
