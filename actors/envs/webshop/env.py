"""The WebShop env: search -> results (10 per page) -> item -> options -> buy, scored by
WebShop's purchase reward; success is a perfect purchase (reward 1.0)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any

from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv
from actors.envs.bracket_actions import split_bracket_action
from actors.envs.registry import register_env
from actors.envs.webshop.catalogue import DEFAULT_CATALOGUE_SEED, DEFAULT_NUM_PRODUCTS
from actors.envs.webshop.goals import Goal, build_goal
from actors.envs.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    DESCRIPTION,
    FEATURES,
    NEXT_PAGE,
    PREV_PAGE,
    RESULTS_PER_PAGE,
    PageState,
    RenderedPage,
    render_page,
)
from actors.envs.webshop.reward import PurchaseReward, purchase_reward
from actors.envs.webshop.shop import Shop, load_shop
from actors.envs.webshop.vocabulary import CATEGORIES

SEARCH_TEMPLATE = "search[<your query>]"  # admissible-list entry for the free-text search bar (verl-agent's form)
NOTHING_HAPPENS = "Nothing happens."


def shop_of(params: dict[str, Any]) -> Shop:
    """The shared shop a task's params name (catalogue_seed, num_products)."""
    return load_shop(
        int(params.get("catalogue_seed", DEFAULT_CATALOGUE_SEED)), int(params.get("num_products", DEFAULT_NUM_PRODUCTS))
    )


@register_env("webshop")
class WebShopEnv(TextEnv):
    """Params: catalogue_seed (default 2022), num_products (default 1200)."""

    default_max_steps = 15

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        super().__init__(params, max_steps)
        self.shop = shop_of(self.params)
        self.goal: Goal | None = None
        self.state = PageState()
        self.steps_taken = 0
        self.done = False

    def task_types(self) -> list[str]:
        return [category.key for category in CATEGORIES]

    def make_task(self, seed: int, split: str) -> EnvTask:
        goal = build_goal(self.shop.products, seed)
        return EnvTask(
            env_name=self.name,
            task_id=f"{self.name}/{split}/{seed}",
            task_type=goal.category,
            seed=seed,
            params=dict(self.params),
        )

    def fingerprint(self, task: EnvTask) -> str:
        # Two seeds can draw the same product and the same asks: the instruction is the task.
        goal = build_goal(shop_of(task.params).products, task.seed)
        return f"{goal.category}:{hashlib.sha256(goal.instruction.encode()).hexdigest()[:16]}"

    def reset(self, task: EnvTask) -> ResetOutcome:
        self.shop = shop_of(task.params)
        self.goal = build_goal(self.shop.products, task.seed)
        self.state = PageState()
        self.steps_taken = 0
        self.done = False
        return ResetOutcome(observation=self._observe(), task_text=self.goal.instruction, task_type=self.goal.category)

    def step(self, action: str | None) -> StepOutcome:
        if self.goal is None:
            raise RuntimeError("WebShopEnv.step() before reset(): reset the env with a task first")
        if self.done:
            return StepOutcome(
                self._observe(prefix=NOTHING_HAPPENS),
                0.0,
                True,
                False,
                False,
                {"error": "episode is over; reset the env"},
            )
        self.steps_taken += 1
        parsed = split_bracket_action(action)
        page = self._page()
        purchase: PurchaseReward | None = None
        valid = False
        if parsed is not None:
            verb, argument = parsed
            if verb == "search" and page.has_search_bar:
                self._search(argument)
                valid = True
            elif verb == "click" and argument.lower() in page.clickables:
                valid = True
                if argument.lower() == BUY_NOW:
                    purchase = self._buy()
                else:
                    self._click(argument.lower())
        self.done = purchase is not None or self.steps_taken >= self.max_steps
        info: dict[str, Any] = {"page": self.state.kind}
        if purchase is not None:
            info.update(
                purchased_asin=self.state.asin,
                selected_options=dict(self.state.selected),
                reward_parts=asdict(purchase),
            )
            observation = self._purchase_page(purchase)
        else:
            observation = self._observe(prefix="" if valid else NOTHING_HAPPENS)
        reward = purchase.total if purchase else 0.0
        return StepOutcome(
            observation=observation,
            reward=reward,
            done=self.done,
            won=purchase is not None and purchase.total >= 1.0 - 1e-9,
            action_valid=valid,
            info=info,
        )

    def expert_action(self) -> str | None:
        """Search the instruction's key words, page to the target, choose the asked options, buy.

        Falls back to searching the target's title if the key words do not surface it in the top 50.
        """
        if self.goal is None or self.done:
            return None
        goal, state = self.goal, self.state
        keywords = f"{' '.join(goal.attributes)} {goal.product_type}"
        if state.kind == "search":
            target_title = self.shop.by_asin[goal.target_asin].title
            return f"search[{target_title if state.query == keywords else keywords}]"
        if state.kind == "results":
            if goal.target_asin not in state.results:
                return f"click[{BACK_TO_SEARCH}]"
            target_page = state.results.index(goal.target_asin) // RESULTS_PER_PAGE + 1
            if target_page > state.page_number:
                return f"click[{NEXT_PAGE}]"
            if target_page < state.page_number:
                return f"click[{PREV_PAGE}]"
            return f"click[{goal.target_asin.lower()}]"
        if state.kind != "item" or state.asin != goal.target_asin:
            return f"click[{PREV_PAGE}]"
        for dim, value in goal.options.items():
            if state.selected.get(dim) != value:
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"

    def _page(self) -> RenderedPage:
        return render_page(self.state, self.shop, self.goal.instruction)

    def _observe(self, prefix: str = "") -> EnvObservation:
        page = self._page()
        admissible = ([SEARCH_TEMPLATE] if page.has_search_bar else []) + [f"click[{c}]" for c in page.clickables]
        text = f"{prefix}\n{page.text}" if prefix else page.text
        return EnvObservation(text=text, anchor_obs=page.text, admissible_actions=[] if self.done else admissible)

    def _purchase_page(self, purchase: PurchaseReward) -> EnvObservation:
        product = self.shop.by_asin[self.state.asin]
        chosen = ", ".join(f"{dim}: {value}" for dim, value in self.state.selected.items()) or "none"
        text = " [SEP] ".join(
            [
                "Thank you for shopping with us!",
                "Purchased",
                product.title,
                "Options",
                chosen,
                "Your score (min 0.0, max 1.0)",
                f"{purchase.total:.2f}",
            ]
        )
        return EnvObservation(text=text, anchor_obs=text, admissible_actions=[])

    def _search(self, query: str) -> None:
        self.state = PageState(
            kind="results", query=query, results=[product.asin for product in self.shop.search(query)]
        )

    def _click(self, label: str) -> None:
        state = self.state
        if label == BACK_TO_SEARCH:
            self.state = PageState(kind="search", query=state.query)
        elif label == NEXT_PAGE:
            state.page_number += 1
        elif label == PREV_PAGE:
            if state.kind == "results":
                state.page_number -= 1
            elif state.kind == "item":
                state.kind, state.asin, state.selected = "results", "", {}
            else:
                state.kind = "item"
        elif label in (DESCRIPTION, FEATURES):
            state.kind = label
        elif state.kind == "results":
            state.kind, state.asin, state.selected = "item", label.upper(), {}
        else:
            product = self.shop.by_asin[state.asin]
            dim = next(dim for dim, values in product.options.items() if label in values)
            state.selected[dim] = label

    def _buy(self) -> PurchaseReward:
        return purchase_reward(self.shop.by_asin[self.state.asin], self.state.selected, self.goal)
