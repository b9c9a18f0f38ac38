"""A model reply as plain text for a terminal: emphasis markers (`**bold**`, `*em*`, `__b__`, `_em_`)
are dropped, everything else is kept as written.

One pass over the text and one over its delimiter runs, each run pushed and popped at most once, so
the cost is linear in the length whatever the text (a `re` with nested groups could backtrack).
Emphasis inside a word is not taken as emphasis, for `*` too (unlike CommonMark): in `17*23*2` the
asterisks are arithmetic. Code spans are left exactly as written.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from collections import defaultdict, deque
from dataclasses import dataclass

# A backslash (with the marker it escapes), or a whole run of one marker: no run is read twice.
_TOKEN_RE = re.compile(r"\\[\\`*_]?|`+|\*+|_+")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


@dataclass(slots=True)
class _Run:
    char: str
    count: int
    can_open: bool
    can_close: bool
    removed: int = 0

    def text(self) -> str:
        return self.char * (self.count - self.removed)


_SPACE, _PUNCTUATION, _OTHER = range(3)


@functools.lru_cache(maxsize=4096)  # one lookup per character kind, not three tests per run
def _kind(ch: str) -> int:
    if ch.isspace():
        return _SPACE
    if ch < "\x80":
        return _PUNCTUATION if ch in _ASCII_PUNCTUATION else _OTHER
    return _PUNCTUATION if unicodedata.category(ch)[0] in "PS" else _OTHER


def _run(text: str, start: int, end: int) -> _Run:
    """A delimiter run text[start:end], with CommonMark's flanking rules (no intraword emphasis)."""
    before = _kind(text[start - 1]) if start > 0 else _SPACE
    after = _kind(text[end]) if end < len(text) else _SPACE
    left = after != _SPACE and (after != _PUNCTUATION or before != _OTHER)
    right = before != _SPACE and (before != _PUNCTUATION or after != _OTHER)
    return _Run(text[start], end - start, left and (not right or before == _PUNCTUATION),
                right and (not left or after == _PUNCTUATION))


def _backtick_runs(text: str) -> dict[int, deque[int]]:
    """Start positions of every backtick run, by run length, in order."""
    runs: dict[int, deque[int]] = defaultdict(deque)
    i = text.find("`")
    while i >= 0:
        end = i
        while end < len(text) and text[end] == "`":
            end += 1
        runs[end - i].append(i)
        i = text.find("`", end)
    return runs


def plain_text(text: str | None) -> str:
    """The text without its emphasis markers."""
    if not text:
        return ""
    pieces: list[str | _Run] = []
    runs: list[_Run] = []
    backticks = _backtick_runs(text)
    done = 0
    for token in _TOKEN_RE.finditer(text):
        at, end = token.span()
        if at < done:  # inside a code span already taken
            continue
        if at > done:
            pieces.append(text[done:at])
        first = text[at]
        if first == "\\":
            pieces.append(text[at + 1] if end - at == 2 else first)  # an escaped marker is a literal character
        elif first == "`":
            same = backticks[end - at]
            while same and same[0] <= at:  # runs already passed (each is dropped once)
                same.popleft()
            if same:  # a code span: kept as written, markers and all
                end = same.popleft() + (end - at)
            pieces.append(text[at:end])
        else:
            run = _run(text, at, end)
            pieces.append(run)
            runs.append(run)
        done = end
    pieces.append(text[done:])
    _pair(runs)
    return "".join(p if p.__class__ is str else p.text() for p in pieces)


def _pair(runs: list[_Run]) -> None:
    """Match closers with the nearest open run of the same character, and mark the markers removed."""
    openers: dict[str, list[_Run]] = {"*": [], "_": []}
    for run in runs:
        stack = openers[run.char]
        if run.can_close:
            left = run.count
            while left and stack:
                opener = stack[-1]
                taken = min(left, opener.count - opener.removed)
                opener.removed += taken
                run.removed += taken
                left -= taken
                if opener.removed == opener.count:
                    stack.pop()
            if run.removed:
                continue
        if run.can_open:
            stack.append(run)


_MARKER_RE = re.compile(r"[*_`\\]")


class PlainTextStream:
    """A reply's plain text while it is written: `feed` the text so far, print what it returns.

    Only settled text is given out, so nothing printed has to be taken back: whole lines, and the
    words before the first emphasis or code marker still unprinted (a marker may pair with one that
    has not arrived yet). Each piece starts after a space or a line break, so its emphasis reads as
    it would in the whole text. `finish` gives the rest."""

    def __init__(self) -> None:
        self.text = ""
        self.done = 0  # characters of `text` already given out

    def feed(self, text: str) -> str:
        self.text = text
        pending = text[self.done:]
        marker = _MARKER_RE.search(pending)
        before = pending[: marker.start()] if marker else pending
        cut = max(pending.rfind("\n"), before.rfind(" "), before.rfind("\t")) + 1
        self.done += cut
        return plain_text(pending[:cut])

    def finish(self, text: str) -> str:
        """The rest of the whole text; all of it again, after a line break, if it is not what was fed."""
        if not text.startswith(self.text[: self.done]):
            return "\n" + plain_text(text)
        return plain_text(text[self.done:])


# Characters a terminal acts on instead of showing: every control character but newline and tab
# (ESC starts a sequence that can retitle the window, rewrite the screen or, in some terminals, set
# the clipboard; C1's CSI does the same in one byte) and the bidirectional overrides, which make
# text read differently from what it is. Each is shown as its escape, e.g. `\x1b`.
TERMINAL_ACTIVE = [cp for cp in range(0x20) if chr(cp) not in "\n\t"] + list(range(0x7F, 0xA0)) + [
    0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_TERMINAL_SAFE = {cp: ascii(chr(cp))[1:-1] for cp in TERMINAL_ACTIVE}


def terminal_safe(text: str) -> str:
    """Untrusted text for a terminal: what a terminal would act on is shown as an escape instead."""
    return text.translate(_TERMINAL_SAFE)
