"""Parsing the model's `<think>...</think><action>...</action>` reply into an env action."""

from __future__ import annotations

import re

_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_OPEN_ACTION = re.compile(r"<action>(.*)$", re.DOTALL | re.IGNORECASE)
MAX_ACTION_CHARS = 512


def parse_action(response: str) -> str | None:
    """The text of the last complete <action> tag (or an unterminated one at the end), stripped.

    None when there is no action or it is empty or absurdly long: such a step is invalid.
    """
    if not response:
        return None
    matches = _ACTION.findall(response)
    text = matches[-1] if matches else None
    if text is None:
        tail = _OPEN_ACTION.search(response)
        text = tail.group(1) if tail else None
    if text is None:
        return None
    text = " ".join(text.split())
    if not text or len(text) > MAX_ACTION_CHARS:
        return None
    return text
