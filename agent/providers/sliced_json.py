"""A provider's JSON reply parsed, scrubbed and redacted in steps of bounded size, so a clock can cut it.

`json.loads` is one C call (8 MiB of small values took 1.2-1.5 s here), and redacting the key from
each of 1.7 million strings one call at a time took 12.6 s: none of it could be cut by a timeout or
Stop. Here the work is a generator that yields between steps of a few milliseconds each; its driver
checks the call's clocks at every yield (agent.providers.call_clock) and gives up by closing it.

Parsing: a body up to ONE_STEP_CHARS is one `json.loads`. A longer one is read here container by
container: a run of simple values (scalars, and arrays or objects nested at most RUN_DEPTH deep)
within RUN_CHARS characters is found by one regex with possessive quantifiers (no backtracking) and
parsed by `json.loads` in C; a longer string by json's C `scanstring`. The result is `json.loads`'s (same
values, a repeated key keeps its first place and its last value); what `json.loads` refuses raises
ValueError, and so does nesting deeper than MAX_DEPTH.

Cleaning (agent.providers.bulk_redaction) follows, unless the body as written shows that no
string in it can need it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from typing import Any

from agent.providers.bulk_redaction import Steps, clean_steps, holds
from agent.text.redaction import reading

ONE_STEP_CHARS = 64 * 1024  # a body this short is parsed in one step (json.loads: at most ~15 ms)
RUN_CHARS = 32 * 1024  # characters of simple values parsed in one step
STEP_TOKENS = 256  # containers opened or closed, keys or long strings read, in one step
FAILED_RUN_TOKENS = 16  # what a run that did not match counts for: it may have read RUN_CHARS first
RUN_DEPTH = 2  # nesting a value inside a run may have (deeper, its containers are opened one by one)
MAX_DEPTH = 512  # nesting of arrays and objects; deeper is refused, as json.loads refuses ~1000

_WS = r"[ \t\n\r]*+"
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
# Lenient: json.loads of the run refuses what JSON does not allow, as it would in the body. A number
# must be followed by what ends one, so that a run cut off at its window never ends inside a number.
_SCALAR = rf"(?>{_STRING}|-?[0-9][-+.0-9eE]*+(?=[ \t\n\r,\]}}])|true|false|null|NaN|-?Infinity)"


def _value(depth: int) -> str:
    """A value whose arrays and objects nest at most `depth` deep (possessive: no backtracking). The
    commas inside them are optional here, which keeps the pattern small (one copy of the level
    below per kind of container): json.loads of the run refuses a missing one, as it would."""
    if depth == 0:
        return _SCALAR
    inner = _value(depth - 1)
    array = rf"\[{_WS}(?:{inner}{_WS},?+{_WS})*+\]"
    obj = rf"\{{{_WS}(?:{_STRING}{_WS}:{_WS}{inner}{_WS},?+{_WS})*+\}}"
    return rf"(?>{_SCALAR}|{array}|{obj})"


# Matched within a window of RUN_CHARS: a value that does not end inside it is left out of the run.
_RUN_VALUE = _value(RUN_DEPTH)
_RUN_MEMBER = rf"{_STRING}{_WS}:{_WS}{_RUN_VALUE}"
_ARRAY_RUN = re.compile(rf"{_RUN_VALUE}(?:{_WS},{_WS}{_RUN_VALUE})*+")
_OBJECT_RUN = re.compile(rf"{_RUN_MEMBER}(?:{_WS},{_WS}{_RUN_MEMBER})*+")
_SPACE = re.compile(_WS)
_ONE_VALUE = json.scanner.make_scanner(json.JSONDecoder())  # json's C scanner: one value at an index


def decode_steps(body: bytes | str, secret: str | None) -> Steps:
    """`scrub_json(json.loads(body))` with `secret` redacted from every string (as `redact_json`)."""
    text = _text(body)
    value = yield from parse_steps(text)
    if (yield from _nothing_to_clean(text, secret)):
        return value
    return (yield from clean_steps(value, secret))


def _nothing_to_clean(text: str, secret: str | None) -> Steps:
    """Whether the body as written shows that no string in it needs scrubbing or redaction.

    Without a `\\u` escape, a string's characters are those of the body (a lone surrogate only if the
    body has one), and its reading is a stretch of the body's reading: the other escapes keep their
    letter once the backslash is read (markup) as nothing. So when neither holds, nothing does."""
    if "\\u" in text or not _encodable(text):
        return False
    target = reading(secret) if secret else ""
    if not target:
        return True
    if not target.isprintable():  # an escape's letter stands where a control character is read
        return False
    return not (yield from holds(text, target))


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(body: bytes | str) -> str:
    if isinstance(body, (bytes, bytearray)):
        return body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads decodes bytes
    return body


# --- parsing ------------------------------------------------------------------------------------

_OPENED, _ITEM, _AFTER = range(3)  # just opened; after a comma (an item must come); after an item


def parse_steps(body: bytes | str) -> Steps:
    """`json.loads(body)`, in steps."""
    text = _text(body)
    if len(text) <= ONE_STEP_CHARS:
        return json.loads(text)
    if text.startswith("\ufeff"):
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    parser = _Parser(text)
    while not parser.finished():
        parser.step()
        yield
    return parser.result()


class _Parser:
    """The containers being filled, innermost last; each step reads a run or one token."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.root: list = []  # holds the top-level value
        self.stack: list[list | dict] = [self.root]
        self.keys: list[str | None] = [None]  # per container: the key of the member being read
        self.state = _ITEM
        self.pos = _SPACE.match(text, 0).end()

    def finished(self) -> bool:
        return len(self.stack) == 1 and self.state == _AFTER

    def result(self) -> Any:
        if self.pos != len(self.text):
            raise ValueError(f"Extra data at character {self.pos}")
        return self.root[0]

    def step(self) -> None:
        """One run of simple values, or up to STEP_TOKENS tokens."""
        budget = STEP_TOKENS
        while budget > 0 and not self.finished():
            budget -= 1
            if self.state == _AFTER:
                self._after_item()
            elif self._run():
                return
            else:
                budget -= FAILED_RUN_TOKENS
                self._one()

    def _run(self) -> bool:
        """A run of simple values where an item is due, parsed in C; False when none starts here."""
        container = self.stack[-1]
        if container is self.root or len(self.stack) + RUN_DEPTH > MAX_DEPTH:
            return False  # near the bound on depth, containers are opened one by one (and counted)
        is_list = container.__class__ is list
        found = (_ARRAY_RUN if is_list else _OBJECT_RUN).match(self.text, self.pos, self.pos + RUN_CHARS)
        if found is None:
            return False
        if is_list:
            container.extend(json.loads("[" + found.group() + "]"))
        else:
            container.update(json.loads("{" + found.group() + "}"))  # a repeated key: as json.loads
        self.pos = _SPACE.match(self.text, found.end()).end()
        self.state = _AFTER
        return True

    def _one(self) -> None:
        """One item that is not simple: a container is opened, a long string or odd value read."""
        text, container = self.text, self.stack[-1]
        if container.__class__ is dict:
            if self.state == _OPENED and text.startswith("}", self.pos):
                self._close()
                return
            self.keys[-1] = self._key()
        elif self.state == _OPENED and text.startswith("]", self.pos):
            self._close()
            return
        char = text[self.pos:self.pos + 1]
        if char in ("[", "{"):
            if len(self.stack) > MAX_DEPTH:
                raise ValueError("nested too deeply")
            self.stack.append([] if char == "[" else {})
            self.keys.append(None)
            self.pos = _SPACE.match(text, self.pos + 1).end()
            self.state = _OPENED
            return
        try:
            value, end = _ONE_VALUE(text, self.pos)  # not a container: a scalar, parsed alone
        except StopIteration as exc:
            raise ValueError(f"Expecting value at character {self.pos}") from exc
        self._store(value)
        self.pos = _SPACE.match(text, end).end()

    def _key(self) -> str:
        if not self.text.startswith('"', self.pos):
            raise ValueError(f"Expecting property name at character {self.pos}")
        key, end = json.decoder.scanstring(self.text, self.pos + 1)
        end = _SPACE.match(self.text, end).end()
        if not self.text.startswith(":", end):
            raise ValueError(f"Expecting ':' delimiter at character {end}")
        self.pos = _SPACE.match(self.text, end + 1).end()
        return key

    def _after_item(self) -> None:
        text, container = self.text, self.stack[-1]
        if text.startswith(",", self.pos):
            self.pos = _SPACE.match(text, self.pos + 1).end()
            self.state = _ITEM
        elif text.startswith("]" if container.__class__ is list else "}", self.pos):
            self._close()
        else:
            raise ValueError(f"Expecting ',' delimiter at character {self.pos}")

    def _close(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos + 1).end()
        self.keys.pop()
        self._store(self.stack.pop())

    def _store(self, value: Any) -> None:
        container = self.stack[-1]
        if container.__class__ is list:
            container.append(value)
        else:
            container[self.keys[-1]] = value  # inserted once complete, as json.loads does
        self.state = _AFTER
