"""An API key found in text the way a person reads it, and replaced, in time linear in the text.

A page decodes what it shows: `&#107;`, `&#x6B`, `&kopf;` (𝕜) become letters, a zero-width space
or a soft hyphen inside a word is not seen, `ｓｋ` (fullwidth) reads as `sk`, case is not noticed.
So the key is looked for in the text's *reading*: HTML character references decoded as a browser
decodes them (numeric with or without `;`, named ones with `;`, the legacy names also without),
every character in its compatibility decomposition (NFKD) and case-folded, and invisible
characters (format characters, category Cf, and the other default-ignorable code points) dropped,
and so is the Markdown a word can hold (`*`, `_`, `~`, backticks, escaping backslashes).
A match is mapped back to the original characters it came from, and that whole span (references
and invisible characters included) is replaced. Only matched spans change: text that does not
read as the key comes back as it was. A text that arrives in pieces is redacted by
agent.text.streamed_redaction; a redacted text is shortened by `cut`, never by a bare slice.

Linear, and in C but for one step per reference and per match: one regex without nested
repetition finds the references; the rest of the text is read in bulk (`str.lower` when plain ASCII,
else `unicodedata.normalize` and one regex substitution); `str.find` finds the key.
"""

from __future__ import annotations

import bisect
import functools
import html.entities
import itertools
import re
import unicodedata

REDACTED = "[redacted]"
REFERENCE_CACHE_LIMIT = 65_536  # distinct references whose reading is kept between calls
MAX_CODE_POINT_DIGITS = 8  # more significant digits than any code point has: out of range
REPLACEMENT_CHARACTER = "\ufffd"
_SEPARATOR = "\0"  # between characters read in bulk; a NUL of the text is read as \x01 there (neither is in a key)

# `&#x…`, `&#…` (any number of digits; `;` optional, as browsers accept) or `&name` (the longest
# HTML name has 31 characters before its `;`). Each alternative is one greedy run: no backtracking.
_REFERENCE_RE = re.compile(r"&(?:#[xX]([0-9A-Fa-f]+);?|#([0-9]+);?|([A-Za-z][A-Za-z0-9]{0,31})(;?))")
_NAMED = html.entities.html5  # "amp;" and, for the legacy names a browser takes without `;`, "amp"
_LEGACY_NAMES = {name for name in _NAMED if not name.endswith(";")}
_LONGEST_LEGACY = max(map(len, _LEGACY_NAMES))
# Windows-1252 meanings of the C1 references (`&#150;` is an en dash), as HTML decodes them.
_C1_REFERENCES = {code: bytes([code]).decode("cp1252", "replace") for code in range(0x80, 0xA0)}
# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) outside category Cf: drawn as nothing.
_IGNORABLE_RANGES = [(0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2060, 0x206F),
                     (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF)]
_FORMAT_PLANES = [range(0x0000, 0x20000), range(0xE0000, 0xE1000)]  # where Unicode assigns category Cf
# Markdown that the page draws as nothing inside a word: emphasis `*` and `_` (`sk-_canary_-…` after a
# punctuation mark), strikethrough `~`, code span backticks, and the backslash of an escape (`sk\-…`
# shows `sk-…`). Read as invisible wherever they are: at worst a text that differs from the key only
# by these is redacted too.
_MARKUP = "*_~`\\"


@functools.cache
def _invisible_re() -> re.Pattern:
    """One character class of every invisible character, markup included (built once, in about 0.1 s)."""
    codes = {code for low, high in _IGNORABLE_RANGES for code in range(low, high + 1)} | set(map(ord, _MARKUP))
    codes.update(code for plane in _FORMAT_PLANES for code in plane if unicodedata.category(chr(code)) == "Cf")
    ranges, ordered = [], sorted(codes)
    for _, run in itertools.groupby(enumerate(ordered), lambda pair: pair[1] - pair[0]):
        run = list(run)
        ranges.append(f"\\U{run[0][1]:08x}-\\U{run[-1][1]:08x}")
    return re.compile("[" + "".join(ranges) + "]")


def _read(text: str) -> str:
    # NFKD, not NFKC: decomposing is done character by character (nothing composes across two), so
    # the reading of a text is the readings of its characters one after another, which maps a
    # match back. It reads `é` as `e` and an accent: never less than NFKC finds, at most more.
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", text).casefold())
    return _invisible_re().sub("", folded)


_MARKUP_RE = re.compile("[" + re.escape(_MARKUP) + "]")
SHORT_TEXT_CHARS = 4096  # below this a class scan is the cheaper test for markup; above, one memchr a mark


def _one_to_one(text: str) -> bool:
    """Whether each character of `text` reads as one character: ASCII, and no markup."""
    if not text.isascii():
        return False
    if len(text) < SHORT_TEXT_CHARS:  # most calls: each string of a streamed chunk
        return _MARKUP_RE.search(text) is None
    return not any(mark in text for mark in _MARKUP)


def reading(text: str) -> str:
    """`text` as read character by character (compatibility forms decomposed, case folded, invisible
    characters and markup dropped); references are left as written (see `redact` for those)."""
    return text.lower() if _one_to_one(text) else _read(text)


def _reading_ends(text: str) -> list[int]:
    """Where the reading of each character of `text` ends in the reading of `text`."""
    # Each character followed by a separator (interleaved as UTF-32 words, in C), read in bulk: the
    # separators come out where they went in, one after each character's reading.
    words = text.replace(_SEPARATOR, "\x01").encode("utf-32-le", "surrogatepass")
    interleaved = bytearray(2 * len(words))
    memoryview(interleaved).cast("I")[0::2] = memoryview(words).cast("I")
    read = _read(interleaved.decode("utf-32-le", "surrogatepass"))
    return list(itertools.accumulate(map(len, read.split(_SEPARATOR)[:-1])))


def _numeric(digits: str, base: int) -> str:
    digits = digits.lstrip("0")
    if len(digits) > MAX_CODE_POINT_DIGITS:
        return REPLACEMENT_CHARACTER
    code = int(digits or "0", base)
    if code in _C1_REFERENCES:
        return _C1_REFERENCES[code]
    if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return REPLACEMENT_CHARACTER
    return chr(code)


def _reference(written: str) -> tuple[int, str]:
    """(length in the text, reading) of the reference `written` (a match of _REFERENCE_RE) begins
    with; length 0 when its `&` is just an `&`."""
    hex_digits, digits, name, semicolon = _REFERENCE_RE.fullmatch(written).groups()
    if hex_digits is not None:
        return len(written), reading(_numeric(hex_digits, 16))
    if digits is not None:
        return len(written), reading(_numeric(digits, 10))
    if semicolon and name + ";" in _NAMED:
        return len(written), reading(_NAMED[name + ";"])
    for length in range(min(len(name), _LONGEST_LEGACY), 1, -1):  # `&notit;` reads as `¬it;`
        if name[:length] in _LEGACY_NAMES:
            return length + 1, reading(_NAMED[name[:length]])
    return 0, ""


# Reference as written -> (its length in the text, its reading); most texts repeat a few references.
_REFERENCES: dict[str, tuple[int, str]] = {}


_REFERENCE, _ONE_TO_ONE, _PLAIN = "reference", "one to one", "plain"  # the kinds of segment


class _Reading:
    """The reading of a whole text, with the way back from a reading offset to the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        pieces: list[str] = []
        # One segment per stretch of plain text or per reference: where its reading starts, its span.
        self.starts: list[int] = []
        self.spans: list[tuple[int, int, str]] = []  # (start, end, kind)
        self._ends: dict[int, list[int]] = {}
        self.length = 0
        plain_from = 0
        # The hot loop of a text full of references: one cached look-up per reference.
        for match in _REFERENCE_RE.finditer(text) if "&" in text else ():
            written = match.group()
            found = _REFERENCES.get(written)
            if found is None:
                found = _reference(written)
                if len(_REFERENCES) < REFERENCE_CACHE_LIMIT:
                    _REFERENCES[written] = found
            size, piece = found
            if not size:
                continue
            start = match.start()
            if start > plain_from:
                self._add_plain(pieces, plain_from, start)
            self._add(pieces, start, start + size, _REFERENCE, piece)
            plain_from = start + size
        if plain_from < len(text):
            self._add_plain(pieces, plain_from, len(text))
        self.value = "".join(pieces)

    def _add_plain(self, pieces: list[str], start: int, end: int) -> None:
        chunk = self.text[start:end]
        if _one_to_one(chunk):
            self._add(pieces, start, end, _ONE_TO_ONE, chunk.lower())
        else:
            self._add(pieces, start, end, _PLAIN, _read(chunk))

    def _add(self, pieces: list[str], start: int, end: int, kind: str, piece: str) -> None:
        pieces.append(piece)
        self.starts.append(self.length)
        self.spans.append((start, end, kind))
        self.length += len(piece)

    def span_of(self, offset: int) -> tuple[int, int]:
        """The span of the text that the reading's character at `offset` comes from."""
        index = bisect.bisect_right(self.starts, offset) - 1
        start, end, kind = self.spans[index]
        if kind == _REFERENCE:
            return start, end
        within = offset - self.starts[index]
        if kind == _PLAIN:
            if index not in self._ends:  # once per stretch a match falls in
                self._ends[index] = _reading_ends(self.text[start:end])
            within = bisect.bisect_right(self._ends[index], within)
        return start + within, start + within + 1


@functools.lru_cache(maxsize=8)  # one key per provider, read once, not once per string of every chunk
def _target(secret: str) -> str:
    return reading(secret)


def read_all(text: str) -> str:
    """The reading `redact` searches for the key: `reading`, with character references decoded too."""
    return _Reading(text).value


def redact(text: str, secret: str | None) -> str:
    """`text` with every span that reads as `secret` replaced by REDACTED (see the module's docstring)."""
    if not secret or not text:
        return text
    target = _target(secret)
    if not target or (_one_to_one(text) and "&" not in text and target not in text.lower()):
        return text  # the common case, without building the way back
    read = _Reading(text)
    spans, _ = _matches(read.value, target, 0, read.span_of)
    return _replaced(text, spans)


def _matches(value: str, target: str, start: int, span_of) -> tuple[list[list[int]], int]:
    """The spans of the text (from `span_of`) whose reading `value` matches `target`, from reading
    offset `start` on, one after another; and the reading offset where the last one ends (or `start`)."""
    spans: list[list[int]] = []
    found, after = value.find(target, start), start
    while found != -1:
        first, last = span_of(found)[0], span_of(found + len(target) - 1)[1]
        if spans and first < spans[-1][1]:  # two matches in one reference: one span
            spans[-1][1] = max(spans[-1][1], last)
        else:
            spans.append([first, last])
        after = found + len(target)
        found = value.find(target, after)
    return spans, after


def _replaced(text: str, spans: list[list[int]]) -> str:
    if not spans:
        return text
    parts, at = [], 0
    for start, end in spans:
        parts += [text[at:start], REDACTED]
        at = end
    parts.append(text[at:])
    return "".join(parts)


def cut(text: str, limit: int) -> str:
    """At most `limit` characters of `text`, ended before a character reference the cut would split:
    `&#1150` cut after `&#115` would read `s`, so a cut of a redacted text could read as the key.
    Cut there, the prefix reads as the start of what the whole text reads."""
    if len(text) <= limit:
        return text
    at = text.rfind("&", 0, max(limit, 0))  # a reference holds no `&` but its first character
    if at != -1 and (reference := _REFERENCE_RE.match(text, at)) is not None:
        size = _REFERENCES.get(reference.group(), (None,))[0]
        if size is None:
            size = _reference(reference.group())[0]
        if at + size > limit:
            return text[:at]
    return text[:limit]
