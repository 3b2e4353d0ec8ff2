"""The structural key of an observation: the exact-match half of observation clustering.

A pure function of the text (no model, no state), so the learner can compute the same key for
its anchor groups that the library uses for its clusters, and so two processes always agree.
"""

from __future__ import annotations

import re

_WHITESPACE = re.compile(r"\s+")
# "countertop 1", "drawer 12": a word followed by an instance number. ALFWorld names every
# receptacle and object this way; the number tells instances apart, not kinds of state.
_INSTANCE_NUMBER = re.compile(r"\b([a-z][a-z_-]*) \d+\b")


def structural_key(observation: str, group_instance_numbers: bool = False) -> str:
    """Lower-cased, whitespace-collapsed observation; with `group_instance_numbers`, every
    'word N' becomes 'word #', so "on countertop 1" and "on countertop 2" share a key."""
    key = _WHITESPACE.sub(" ", observation.strip().lower())
    if group_instance_numbers:
        key = _INSTANCE_NUMBER.sub(r"\1 #", key)
    return key
