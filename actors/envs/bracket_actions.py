"""`verb[argument]` actions, the form WebShop (`search[...]`, `click[...]`) and search QA
(`search[...]`, `answer[...]`) share; one parser so both reject malformed text the same way."""

from __future__ import annotations

import re

_BRACKET_ACTION = re.compile(r"^([a-z_]+)\[(.*)\]$", re.DOTALL | re.IGNORECASE)
MAX_ARGUMENT_CHARS = 512  # same bound as parse_action: longer text is a runaway generation, not an action


def split_bracket_action(action: str | None) -> tuple[str, str] | None:
    """(verb in lower case, argument with whitespace collapsed) of `verb[argument]`.

    None for anything else (no brackets, "click[", an empty or oversized argument), so the
    env can mark the step invalid without guessing what was meant.
    """
    if not action or len(action) > 2 * MAX_ARGUMENT_CHARS:
        return None
    match = _BRACKET_ACTION.match(action.strip())
    if match is None:
        return None
    verb, argument = match.group(1).lower(), " ".join(match.group(2).split())
    if not argument or len(argument) > MAX_ARGUMENT_CHARS:
        return None
    return verb, argument
