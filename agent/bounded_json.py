"""JSON with its nesting bounded: the one place the depth of arrays and objects is checked.

Python recurses once per level of JSON, and so does every reader after it: json.loads raises
RecursionError near 1,000 levels, json.dumps, scrub_json and a page's renderers much
sooner when they run deep in a stack. So every boundary where JSON enters (a provider's reply, a
tool call's arguments, what Redis holds) decodes it here, and every value made inside the process
that goes into the state (a Python tool's dict, an MCP tool's structured result) is checked here
first: nothing downstream meets more than MAX_DEPTH levels, and TooDeep says why in words.

The check on text is a linear pre-scan of bracket depth outside strings, before json.loads, so a
body of millions of brackets is refused without being parsed. `loads(..., cut=True)` decodes such
a text anyway, each too-deep part replaced by a Cut that keeps its text: a provider's reply whose
tool input is too deep still reads as a reply, and the tool layer refuses that input by its own
depth (`dumps` writes a Cut back as the text it was cut from). Pure: no I/O.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
import secrets
from dataclasses import dataclass
from typing import Any

from agent.text.surrogates import scrub

MAX_DEPTH = 64  # levels of arrays and objects in any JSON value the agent takes in or keeps
TOO_DEEP = "nested too deeply"  # the words every refusal starts with, for a person and for the model

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # unrolled: one linear pass, no backtracking
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]+|[\]}]+', re.S)
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # an opener counts +1, a closer -1 (minus 1 each)
_LEAF_PASSES = 2  # innermost levels removed by str.replace before the running sum: most JSON is shallow
_NONCE = secrets.token_hex(8)  # marks this process's placeholders for cut parts; no input can guess it
_PLACEHOLDER = re.compile(r'"\\u0000cut-' + _NONCE + r'-([0-9]+)"')
_ESCAPE = re.compile(r"(\\\\)|\\u([0-9a-fA-F]{4})")  # left to right, so "\\\\u0041" is no escape
_STRING_BYTES = re.compile(_STRING.pattern.encode(), re.S)
_DECODER = json.JSONDecoder()


class TooDeep(ValueError):
    """JSON, or a value, nested deeper than the bound; `str()` names the cause for a person."""

    def __init__(self, max_depth: int = MAX_DEPTH):
        super().__init__(f"{TOO_DEEP} (more than {max_depth} levels of arrays and objects)")
        self.max_depth = max_depth


@dataclass(frozen=True)
class Cut:
    """A part of a JSON text that was nested too deeply to decode: its text, as it came."""

    raw: str


def exceeds(text: str | bytes, max_depth: int = MAX_DEPTH) -> bool:
    """True when arrays and objects in `text` nest more than `max_depth` deep (brackets inside
    strings do not count). Linear; exact for valid JSON, and never False for text json.loads
    would take deeper than `max_depth`."""
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= max_depth:
            return False  # the common case: too few openers to nest that deep, no scan needed
        if '"' in text:
            text = _STRING.sub("", text)
        steps = text.encode("utf-8", "surrogatepass").translate(_STEPS, _NOT_BRACKETS)
    else:
        if text.count(b"[") + text.count(b"{") <= max_depth:
            return False
        steps = (_STRING_BYTES.sub(b"", text) if b'"' in text else text).translate(_STEPS, _NOT_BRACKETS)
    if b"\x02" * (max_depth + 1) in steps:
        return True  # a plain run of openers: found by one search, before any counting
    for _ in range(min(_LEAF_PASSES, max_depth)):  # each pass takes away the innermost level, in C
        steps = steps.replace(b"\x02\x00", b"")
        max_depth -= 1
    # The running sum of +1 and -1 per bracket, all in C: at most about 0.5 s for 8 MiB of brackets.
    return max(itertools.accumulate(map(operator.sub, steps, itertools.repeat(1))), default=0) > max_depth


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH, cut: bool = False,
          decoder: json.JSONDecoder = _DECODER) -> Any:
    """json.loads, nested at most `max_depth` deep: TooDeep when deeper (or, with `cut`, each part
    past that depth as a Cut), ValueError when not JSON. Bytes are read as UTF-8."""
    if isinstance(text, bytes | bytearray):
        text = _utf8(bytes(text))
    if not exceeds(text, max_depth):
        return _decode(text, max_depth, decoder)
    if not cut:
        raise TooDeep(max_depth)
    kept, parts = _cut(text, max_depth)
    return _restore(_decode(kept, max_depth, decoder), parts)


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")  # as json.loads reads bytes
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason})") from None


def _decode(text: str, max_depth: int, decoder: json.JSONDecoder) -> Any:
    try:
        return decoder.decode(text)
    except RecursionError:  # not reached after the scan; kept so that no caller ever sees one
        raise TooDeep(max_depth) from None


def _cut(text: str, max_depth: int) -> tuple[str, list[str]]:
    """`text` with each outermost part deeper than `max_depth` replaced by a placeholder string,
    and those parts' texts, in order. One pass over strings and runs of brackets."""
    pieces: list[str] = []
    parts: list[str] = []
    depth, kept_from, start = 0, 0, -1
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token[0] in "[{":
            if depth <= max_depth < depth + len(token):
                start = match.start() + (max_depth - depth)  # the first opener past the bound
            depth += len(token)
        else:
            if depth > max_depth >= depth - len(token) and start >= 0:
                end = match.start() + (depth - max_depth)  # just after the closer back at the bound
                pieces += [text[kept_from:start], f'"\\u0000cut-{_NONCE}-{len(parts)}"']
                parts.append(scrub(text[start:end]))
                kept_from, start = end, -1
            depth -= len(token)
    if start >= 0:  # never closed: not JSON; kept whole, so json.loads says what is wrong with it
        return text, []
    pieces.append(text[kept_from:])
    return "".join(pieces), parts


def shallow_prefix(text: str, max_depth: int = MAX_DEPTH) -> str:
    """The start of `text` up to where its nesting first passes `max_depth` (all of it if never):
    what a parser of a cut-off text (a line's first bytes) may be given whole."""
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token[0] in "[{" and depth + len(token) > max_depth:
            return text[:match.start() + max(0, max_depth - depth)]
        depth += len(token) if token[0] in "[{" else -len(token)
    return text


def _restore(value: Any, parts: list[str]) -> Any:
    """The decoded value with each placeholder string back as a Cut (recursion bounded by the cut)."""
    if isinstance(value, str):
        prefix = f"\x00cut-{_NONCE}-"
        return Cut(parts[int(value[len(prefix):])]) if value.startswith(prefix) else value
    if isinstance(value, list):
        return [_restore(item, parts) for item in value]
    if isinstance(value, dict):
        return {key: _restore(item, parts) for key, item in value.items()}
    return value


def spelled_out(raw: str) -> str:
    """JSON text with each `\\uXXXX` escape of a character that may stand in a string as itself written as
    that character: what a redaction must read in a Cut, whose strings were never decoded. Still JSON."""
    def one(match: re.Match) -> str:
        if match.group(1):
            return match.group(1)  # an escaped backslash: what follows it is text, not an escape
        char = chr(int(match.group(2), 16))
        return match.group(0) if char in '"\\' or char < " " or "\ud800" <= char <= "\udfff" else char

    return _ESCAPE.sub(one, raw) if "\\u" in raw else raw


def dumps(value: Any, **options: Any) -> str:
    """json.dumps, each Cut written back as the text it was cut from."""
    cuts: list[str] = []

    def placeholder(item: Any) -> str:
        if not isinstance(item, Cut):
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
        cuts.append(item.raw)
        return f"\x00cut-{_NONCE}-{len(cuts) - 1}"

    text = json.dumps(value, default=placeholder, **options)
    return _PLACEHOLDER.sub(lambda match: cuts[int(match.group(1))], text) if cuts else text


def check(value: Any, max_depth: int = MAX_DEPTH) -> Any:
    """`value` itself when its lists, tuples and objects nest at most `max_depth` deep, else
    TooDeep. Level by level, never recursion, so any value made in the process can be checked."""
    level, depth = [value], 0
    while level:
        containers = [item for item in level if isinstance(item, dict | list | tuple)]
        if not containers:
            return value
        depth += 1
        if depth > max_depth:
            raise TooDeep(max_depth)
        level = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)]
    return value
