"""Lone surrogates: text Python can hold but UTF-8 cannot encode.

JSON allows `"\\ud800"`, so any provider response, tool argument or error body can carry one;
Redis (and httpx, which sends JSON as UTF-8) then raises UnicodeEncodeError. Text is scrubbed
where it enters the system and again where the state is serialised.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"  # U+FFFD REPLACEMENT CHARACTER, what a UTF-8 decoder shows for bad input
_SURROGATE = re.compile("[\ud800-\udfff]")  # a character class: one linear pass, no backtracking


def scrub(text: str) -> str:
    """The text with every lone surrogate replaced by U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(REPLACEMENT, text)
    return text


def scrub_json(value: Any) -> Any:
    """A parsed JSON value with every string (keys included) scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [scrub_json(item) for item in value]
    if isinstance(value, dict):
        return {scrub(key): scrub_json(item) for key, item in value.items()}
    return value
