"""A provider's JSON reply parsed, scrubbed and redacted in steps of bounded size, so a clock can cut it.

`json.loads` is one C call (8 MiB of small values took 1.2-1.5 s here), and redacting the key from
each of 1.7 million strings one call at a time took 12.6 s: none of it could be cut by a timeout or
Stop. Here the work is a generator that yields between steps of a few milliseconds each; its driver
checks the call's clocks at every yield (agent.providers.call_clock) and gives up by closing it.

Parsing: a body up to ONE_STEP_CHARS is one `json.loads`. A longer one is read here container by
container: runs of up to RUN_VALUES simple values (scalars, and arrays or objects of at most
FLAT_VALUES scalars) are found by one regex with possessive quantifiers (no backtracking) and parsed
by `json.loads` in C; longer strings by json's C `scanstring`. The result is `json.loads`'s (same
values, a repeated key keeps its first place and its last value); what `json.loads` refuses raises
ValueError, and so does nesting deeper than MAX_DEPTH.

Cleaning: every string (object keys included) is scrubbed of lone surrogates and, with a key, has the
key redacted exactly as `redact` does it to that string alone. The strings are taken in batches of
about BATCH_CHARS, joined by a control character that no reading of a key holds and that ends every
reading (see `_separator`), and handled as one text: one bulk pass instead of a Python call per
string. A text longer than PIECE_CHARS is first screened in pieces cut where no reading crosses the
cut, and redacted whole only when the key is in it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
import unicodedata
from collections.abc import Generator
from typing import Any

from agent.redaction import read_all, reading, redact
from agent.surrogates import scrub

Steps = Generator[None, None, Any]  # yields between steps; returns the result

ONE_STEP_CHARS = 64 * 1024  # a body this short is parsed in one step (json.loads: at most ~15 ms)
RUN_CHARS = 32 * 1024  # characters of simple values parsed in one step
STEP_TOKENS = 256  # containers opened or closed, keys or long strings read, in one step
FAILED_RUN_TOKENS = 16  # what a run that did not match counts for: it may have read RUN_CHARS first
RUN_DEPTH = 2  # nesting a value inside a run may have (deeper, its containers are opened one by one)
MAX_DEPTH = 512  # nesting of arrays and objects; deeper is refused, as json.loads refuses ~1000
BATCH_CHARS = 64 * 1024  # characters of strings cleaned in one step
BATCH_ITEMS = 8 * 1024  # array items or object members looked at in one step
PIECE_CHARS = 64 * 1024  # a longer text is screened for the key in pieces of about this size
CUT_SEARCH_CHARS = 1024  # how far past a piece's end a place to cut it is looked for

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
# A place to cut a long text for screening: before an ASCII character that no character reference holds.
_ASCII_CUT = re.compile(r"[^0-9A-Za-z#;\x80-\U0010ffff]")
_SEPARATORS = "\0\1\2\3\4\5\6\7\x08\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f"


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
    return not (yield from _holds(text, target))


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


# --- scrubbing and redaction --------------------------------------------------------------------


def clean_steps(value: Any, secret: str | None) -> Steps:
    """`value` with every string scrubbed and `secret` redacted (changed in place), in steps."""
    target = reading(secret) if secret else ""
    holder = [value]
    batch = _Batch(secret if target else None, target)
    pending: list[list | dict] = [holder]
    visited = 0  # items looked at since the last step: many small containers hold few strings
    while pending:
        container = pending.pop()
        visited += 1
        if visited >= BATCH_ITEMS:
            visited = 0
            yield
        items = container if container.__class__ is list else list(container.items())
        for start in range(0, len(items), BATCH_ITEMS):
            part = items[start:start + BATCH_ITEMS]
            if container.__class__ is list:
                texts, values = [item for item in part if item.__class__ is str], part
            else:
                values = [item for _, item in part]
                texts = [key for key, _ in part] + [item for item in values if item.__class__ is str]
            pending += [item for item in values if item.__class__ is list or item.__class__ is dict]
            batch.add(texts, container, part if container.__class__ is dict else start)
            visited += len(part)
            if batch.full():
                yield from batch.flush()
                yield
    yield from batch.flush()
    for container, renamed in batch.renamed.values():
        members = [(renamed.get(key, key), item) for key, item in container.items()]
        container.clear()
        container.update(members)  # keys that now read the same: the first place and the last value, as before
    return holder[0]


class _Batch:
    """Strings gathered from containers, cleaned as one text; changed ones are put back where they were."""

    def __init__(self, secret: str | None, target: str) -> None:
        self.secret = secret
        self.target = target
        self.texts: list[str] = []
        # (container, where: a list's offset or the object's members taken, index of its first text)
        self.owners: list[tuple[list | dict, Any, int]] = []
        self.chars = 0
        self.renamed: dict[int, tuple[dict, dict[str, str]]] = {}  # id -> (object, {key: its new key})

    def add(self, texts: list[str], container: list | dict, where: Any) -> None:
        if texts:
            self.owners.append((container, where, len(self.texts)))
            self.texts += texts
            self.chars += sum(map(len, texts))

    def full(self) -> bool:
        return self.chars >= BATCH_CHARS or len(self.texts) >= BATCH_ITEMS

    def flush(self) -> Steps:
        texts, owners = self.texts, self.owners
        self.texts, self.owners, self.chars = [], [], 0
        if not texts:
            return
        cleaned = yield from _clean_texts(texts, self.secret, self.target)
        if cleaned is None:
            return
        bounds = [first for _, _, first in owners] + [len(texts)]
        for index, (container, where, first) in enumerate(owners):
            stop = bounds[index + 1]
            if cleaned[first:stop] != texts[first:stop]:
                self._put_back(container, where, iter(cleaned[first:stop]))

    def _put_back(self, container: list | dict, where: Any, new: Any) -> None:
        if container.__class__ is list:
            for at in range(where, min(where + BATCH_ITEMS, len(container))):
                if container[at].__class__ is str:
                    container[at] = next(new)
            return
        keys = [next(new) for _ in where]
        for key, item in where:
            if item.__class__ is str:
                container[key] = next(new)  # the value in place; a key is renamed once all are cleaned
        renames = {key: new_key for (key, _), new_key in zip(where, keys, strict=True) if new_key != key}
        if renames:
            self.renamed.setdefault(id(container), (container, {}))[1].update(renames)


def _clean_texts(texts: list[str], secret: str | None, target: str) -> Steps:
    """What `redact(scrub(text), secret)` makes of each text, or None when that changes none of them."""
    found = _separator(texts, target)
    if found is None:  # every candidate occurs in the texts: one at a time (never seen in practice)
        cleaned = []
        for text in texts:
            cleaned.append(redact(scrub(text), secret))
            yield
        return cleaned if cleaned != texts else None
    separator, joined = found
    fixed = scrub(joined)  # a lone surrogate becomes U+FFFD: the separators are untouched
    # Spans never cross a separator (see _separator). A batch is redacted at once; a longer text
    # (one long string) is screened in pieces first, and redacted whole only if it holds the key.
    if secret and (len(fixed) <= BATCH_CHARS + PIECE_CHARS or (yield from _holds(fixed, target))):
        fixed = redact(fixed, secret)
    if fixed is joined:
        return None
    return fixed.split(separator)


def _separator(texts: list[str], target: str) -> tuple[str, str] | None:
    """The texts joined by a character in no text and not in the key's reading: a C0 control reads as
    itself, ends every character reference and is a starter (no combining mark reorders across it),
    so the reading of the joined texts is their readings joined by it, and no match can cross it."""
    for candidate in _SEPARATORS:
        if candidate not in target:
            joined = candidate.join(texts)
            if joined.count(candidate) == len(texts) - 1:
                return candidate, joined
    return None


def _holds(text: str, target: str) -> Steps:
    """Whether the reading of `text` holds `target`, read in pieces (a step each) when it is long."""
    if len(text) <= PIECE_CHARS:
        return target in read_all(text)
    keep = len(target) - 1
    carry = ""
    for piece in _pieces(text):
        window = carry + read_all(piece)
        if target in window:
            return True
        carry = window[max(0, len(window) - keep):] if keep else ""
        yield
    return False


def _pieces(text: str):
    """`text` in pieces of about PIECE_CHARS, cut only before a character whose reading stands alone:
    no character reference and no reordering of combining marks crosses the cut, so the reading of
    the text is the readings of its pieces one after another."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        cut = _cut_at_or_after(text, start + PIECE_CHARS)
        if cut is None:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _cut_at_or_after(text: str, index: int) -> int | None:
    end = min(len(text), index + CUT_SEARCH_CHARS)
    found = _ASCII_CUT.search(text, index, end)
    if found is not None:
        return found.start()
    for at in range(index, end):  # no ASCII place nearby: a starter with no decomposition will do
        char = text[at]
        if not char.isascii() and not unicodedata.combining(char) and not unicodedata.decomposition(char):
            return at
    return None
