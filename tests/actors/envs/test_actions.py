"""Parsing model replies into actions (parse_action) and bracket actions (split_bracket_action)."""

from __future__ import annotations

import pytest

from actors.envs.actions import parse_action
from actors.envs.bracket_actions import split_bracket_action


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>go</think><action>click[buy now]</action>", "click[buy now]"),
        ("<action>up</action> then <ACTION> down </ACTION>", "down"),  # the last complete tag, case-insensitive
        ("<think>hmm</think><action>search[red\n  shoes]", "search[red shoes]"),  # unterminated at the end
        ("<action>  </action>", None),
        ("no tags at all", None),
        ("", None),
        ("<action>" + "x" * 600 + "</action>", None),  # runaway generation
    ],
)
def test_parse_action(response, expected):
    assert parse_action(response) == expected


@pytest.mark.parametrize(
    "action, expected",
    [
        ("click[Buy Now]", ("click", "Buy Now")),
        ("Search[ red   shoes ]", ("search", "red shoes")),
        ("answer[[1999]]", ("answer", "[1999]")),
        ("click[", None),
        ("click[]", None),
        ("click buy now", None),
        ("click[x]y", None),
        (None, None),
        ("search[" + "q" * 10_000 + "]", None),
    ],
)
def test_split_bracket_action(action, expected):
    assert split_bracket_action(action) == expected
