"""Untrusted text shown exactly: every character that a reader would not see, or that makes the text
read differently from what it is, is shown as its escape instead.

What a person approves must be what runs: a right-to-left override makes `000,01$` read `$10,000`, a
zero-width space or a tag character (U+E0041 is an invisible "A") hides text in plain sight, a lone
control character can act on a terminal. So each of these is written as its escape (`\\u202e`), in
text (`visible`) and inside a JSON text (`visible_json`, where the escape is JSON's own, so the text
shown still decodes to exactly the value). Ordinary spaces, tabs and line breaks are kept in text.
Pure: no I/O.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from typing import Any

# Invisible although not of an invisible category: variation selectors, Hangul fillers, the Khmer
# inherent vowels, the combining grapheme joiner, the Mongolian vowel separator, the Braille blank.
_INVISIBLE_EXTRA = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180E, 0x2800, 0x3164, 0xFFA0,
                              *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)])
# Control, format (bidirectional marks and overrides, zero-width characters, tag characters), private
# use, surrogates, unassigned, and line or paragraph separators; spaces other than the plain one.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp", "Zs"})


@functools.lru_cache(maxsize=8192)
def hidden(ch: str) -> bool:
    """Whether a reader would not see the character as itself (a plain space, tab and newline are seen)."""
    if ch < "\x7f":
        return ch < " " and ch not in "\n\t"
    cp = ord(ch)
    return cp in _INVISIBLE_EXTRA or unicodedata.category(ch) in _INVISIBLE_CATEGORIES


def escape(ch: str) -> str:
    """A character's escape, as Python and JSON both read it: `\\x1b`, `\\u202e`, `\\U000e0041`."""
    cp = ord(ch)
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def visible(text: str) -> str:
    """The text with each hidden character shown as its escape (a backslash already in the text stays as it is)."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(escape(ch) if hidden(ch) else ch for ch in text)


def _json_escape(ch: str) -> str:
    cp = ord(ch)
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    cp -= 0x10000  # JSON has no \U: a UTF-16 surrogate pair, which json.loads joins again
    return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"


def visible_json(value: Any, *, indent: int | None = 2) -> str:
    """`value` as JSON text with every hidden character inside its strings escaped: the text reads as
    it decodes. Outside strings JSON has only ASCII, so every hidden character is inside one."""
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    if text.isascii() and "\x7f" not in text:  # json.dumps escapes every other ASCII control character
        return text
    return "".join(_json_escape(ch) if hidden(ch) else ch for ch in text)


def shown_json_text(text: str, *, indent: int | None = 2) -> str:
    """A JSON text as the reader of it gets it: decoded (a repeated key once, with the value that the
    decoding keeps: the last) and written again with its hidden characters escaped. Text that is no
    JSON, or nested too deeply to write again, is shown as it is, with its hidden characters escaped."""
    try:
        return visible_json(json.loads(text), indent=indent)
    except (ValueError, RecursionError):
        return visible(text)
