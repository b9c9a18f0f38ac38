"""Every string of a parsed JSON value (object keys included) scrubbed of lone surrogates and, with a
key, redacted exactly as `redact` does it to that string alone, in steps of bounded size.

Redacting 1.7 million short strings one call at a time cost seconds. Here the strings are taken in
batches of about BATCH_CHARS, joined by a control character that no reading of a key holds and that
ends every reading (see `_separator`), and handled as one text: one bulk pass instead of a Python call
per string; only when something changed are the parts put back. A text longer than a batch (one
long string) is screened for the key in pieces cut where no reading crosses the cut (`holds`), and
redacted whole only when the key is in it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Generator
from typing import Any

from agent.text.redaction import read_all, reading, redact
from agent.text.surrogates import scrub

Steps = Generator[None, None, Any]  # yields between steps; returns the result

BATCH_CHARS = 64 * 1024  # characters of strings cleaned in one step
BATCH_ITEMS = 8 * 1024  # array items or object members looked at in one step
PIECE_CHARS = 64 * 1024  # a longer text is screened for the key in pieces of about this size
CUT_SEARCH_CHARS = 1024  # how far past a piece's end a place to cut it is looked for
# A place to cut a long text for screening: before an ASCII character that no character reference holds.
_ASCII_CUT = re.compile(r"[^0-9A-Za-z#;\x80-\U0010ffff]")
_SEPARATORS = "\0\1\2\3\4\5\6\7\x08\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f"


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
    if secret and (len(fixed) <= BATCH_CHARS + PIECE_CHARS or (yield from holds(fixed, target))):
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


def holds(text: str, target: str) -> Steps:
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
