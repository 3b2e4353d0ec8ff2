"""Validate what a model answered to Prompt B or C, and turn it into candidates.

The answer must be a JSON array (optionally inside one ``` fence) of at most 3 objects of the
prompt's shape, each naming a step of the episode. Anything else is rejected as a whole, with a
reason that becomes a metric label: a half-valid answer from a confused model is not evidence.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from library.episodes import Episode, episode_score, failure_severity
from library.experience import STRATEGY, WARNING, Candidate

MAX_ITEMS = 3
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class ExtractionRejected(ValueError):
    """Model output that is not valid JSON of the expected shape; `reason` labels the metric."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class StrategyItem(BaseModel):
    level: Literal["principle", "method", "example"]
    content: str = Field(min_length=8, max_length=600)
    cue: str = Field(min_length=1, max_length=400)
    step: int = Field(ge=0)


class WarningItem(BaseModel):
    level: Literal["mistake", "pattern", "diagnostic"]
    content: str = Field(min_length=8, max_length=600)
    trigger: str = Field(min_length=1, max_length=400)
    step: int = Field(ge=0)
    avoid: str = Field(max_length=200)
    instead: str = Field("", max_length=200)


def _items(text: str, item_type: type[BaseModel], episode: Episode) -> list:
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        raw = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ExtractionRejected("not_json", f"{exc.msg} at char {exc.pos} of {body[:80]!r}") from None
    if not isinstance(raw, list):
        raise ExtractionRejected("not_a_list", f"expected a JSON array, got {type(raw).__name__}")
    if len(raw) > MAX_ITEMS:
        raise ExtractionRejected("too_many_items", f"{len(raw)} items, at most {MAX_ITEMS}")
    try:
        items = TypeAdapter(list[item_type]).validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ExtractionRejected("bad_item", f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    for item in items:
        if item.step >= len(episode.steps):
            raise ExtractionRejected("bad_item", f"step {item.step} does not exist (episode has {len(episode.steps)})")
    return items


def parse_strategies(text: str, episode: Episode) -> list[Candidate]:
    """Prompt B answer -> strategy candidates (raises ExtractionRejected)."""
    score = episode_score(episode)
    return [
        Candidate(
            STRATEGY,
            item.level,
            item.content,
            item.cue,
            episode.task_type,
            [episode.steps[item.step].anchor_obs],
            score,
            [episode.episode_id],
        )
        for item in _items(text, StrategyItem, episode)
    ]


def parse_warnings(text: str, episode: Episode) -> list[Candidate]:
    """Prompt C answer -> warning candidates (raises ExtractionRejected)."""
    score = failure_severity(episode)
    return [
        Candidate(
            WARNING,
            item.level,
            item.content,
            item.trigger,
            episode.task_type,
            [episode.steps[item.step].anchor_obs],
            score,
            [episode.episode_id],
            item.avoid,
            item.instead,
        )
        for item in _items(text, WarningItem, episode)
    ]
