"""`redact` for a text that arrives in pieces (a streamed reply): what is handed on is never taken
back, and the pieces handed on join to exactly `redact(whole text)`, in time linear in the text.

Redacting each piece alone misses a key split across two, also inside what a page decodes as one
character (`&#115;&#107;` then `-…`, `&#11` then `5;k-…`, `s` and a zero-width space then `k-…`).
Here the text is handed on up to a *closed* point only: one where no character reference is still
open (`&#11` may go on as `&#115`, `&not` as `&notin;`) and no end of the reading so far is a proper
start of the key's reading (the next piece could complete it). No later text changes the reading of
what lies before such a point, nor makes a match that crosses it, so `redact` of the text up to it
is final, and each join of the first pieces handed on is `redact` of a prefix: it never reads as the
key either (a page may show any of them, as the live text of a reply being written).

What is read again with the next piece is bounded: the reading held back (shorter than the key's
reading, with the spans it comes from) and the open reference, its digits kept canonical (`&#0000115`
as `&#115`, more digits than a code point has as nine nines, which read alike). The text held back
can be long (a key's start, then a megabyte of zero-width spaces) but it is never read again: it is
only joined once when it is handed on.
"""

from __future__ import annotations

import re
import unicodedata

from agent.text.redaction import MAX_CODE_POINT_DIGITS, _matches, _Reading, _replaced, reading

# A reference that the next text may still lengthen or end otherwise: `&`, `&#`, `&#x`, digits (any
# number: leading zeros count for nothing), or a name of up to 32 characters (its `;` may follow).
_OPEN_REFERENCE_RE = re.compile(r"&(?:#(?:[xX][0-9A-Fa-f]*|[0-9]*)|[A-Za-z][A-Za-z0-9]{0,31})?")
_NUMBER_RE = re.compile(r"&#([xX]?)([0-9A-Fa-f]+)")


class StreamRedactor:
    """`feed` each piece and hand on what it returns, then what `close` returns."""

    def __init__(self, secret: str | None) -> None:
        self._target = reading(secret) if secret else ""
        # A key's reading is ASCII in practice: all starters (combining class 0), which NFKD never
        # reorders, so where the text is cut cannot change a match. One with a combining mark in its
        # reading is matched in the whole text at the end, and nothing is handed on before.
        self._at_end_only = any(unicodedata.combining(char) for char in self._target)
        self._held: list[str] = []  # the text not handed on yet, as it came
        self._held_chars = 0
        self._value = ""  # the reading of the held text up to its open reference
        self._units: list[tuple[int, int]] = []  # for each character of _value: the held span it comes from
        self._open = ""  # the open reference at the held text's end, canonical
        self._open_chars = 0  # ... and its length as written

    def feed(self, piece: str) -> str:
        """What can be handed on now that `piece` has arrived (possibly nothing)."""
        if not piece or not self._target:
            return piece
        self._held.append(piece)
        self._held_chars += len(piece)
        return "" if self._at_end_only else self._advance(piece, final=False)

    def close(self) -> str:
        """The rest: the text has ended."""
        if not self._held:
            return ""
        if self._at_end_only:
            text = "".join(self._held)
            self._held = []
            read = _Reading(text)
            return _replaced(text, _matches(read.value, self._target, 0, read.span_of)[0])
        return self._advance("", final=True)

    def _advance(self, piece: str, *, final: bool) -> str:
        fresh = self._open + piece  # read now: the open reference again, and the piece
        fresh_at = self._held_chars - len(piece) - self._open_chars  # where `fresh` begins in the held text
        open_len, shift = len(self._open), self._open_chars - len(self._open)

        def held_offset(offset: int) -> int:  # an offset in `fresh` -> in the held text
            return fresh_at + offset + (shift if offset >= open_len else 0)

        open_at = len(fresh) if final else _open_reference(fresh)
        read = _Reading(fresh[:open_at])
        known, value = len(self._value), self._value + read.value

        def span_of(offset: int) -> tuple[int, int]:  # a reading offset -> the held span it comes from
            if offset < known:
                return self._units[offset]
            start, end = read.span_of(offset - known)
            return held_offset(start), held_offset(end)

        spans, after = _matches(value, self._target, 0, span_of)
        keep_from = len(value) if final else len(value) - _key_start_at_end(value, after, self._target)
        hold = span_of(keep_from)[0] if keep_from < len(value) else held_offset(open_at)
        if spans and spans[-1][1] > hold:  # the key's start begins inside the last match's last character
            hold = spans.pop()[0]  # held with it: the match is found again, whole, with the next piece
            keep_from = after - len(self._target)
        while keep_from > 0 and span_of(keep_from - 1)[0] >= hold:  # the whole reading of what is held
            keep_from -= 1
        open_chars = self._held_chars - held_offset(open_at)
        self._units = [(start - hold, end - hold) for start, end in map(span_of, range(keep_from, len(value)))]
        self._value = value[keep_from:]
        self._open, self._open_chars = ("", 0) if final else (_canonical(fresh[open_at:]), open_chars)
        if not hold:
            return ""
        whole = "".join(self._held)
        rest = whole[hold:]
        self._held, self._held_chars = ([rest] if rest else []), len(rest)
        return _replaced(whole[:hold], spans)


def _open_reference(text: str) -> int:
    """Where the reference still open at the end of `text` begins (its length if none is)."""
    at = text.rfind("&")  # an open reference holds no other `&`
    return at if at != -1 and _OPEN_REFERENCE_RE.fullmatch(text, at) else len(text)


def _canonical(reference: str) -> str:
    """An open reference as short as it can be written with the same reading, now and once it goes on."""
    number = _NUMBER_RE.fullmatch(reference)
    if number is None:
        return reference  # a name (at most 33 characters), `&`, `&#` or `&#x`
    digits = number.group(2).lstrip("0") or "0"
    if len(digits) > MAX_CODE_POINT_DIGITS:
        digits = "9" * (MAX_CODE_POINT_DIGITS + 1)  # out of range, however many digits follow
    return f"&#{number.group(1)}{digits}"


def _key_start_at_end(value: str, after: int, target: str) -> int:
    """The length of the longest end of `value[after:]` that is a proper start of `target`."""
    at = value.find(target[0], max(after, len(value) - len(target) + 1))
    while at != -1:
        if target.startswith(value[at:]):
            return len(value) - at
        at = value.find(target[0], at + 1)
    return 0
