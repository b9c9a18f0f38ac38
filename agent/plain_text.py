"""A model reply as plain text for a terminal: emphasis markers (`**bold**`, `*em*`, `__b__`, `_em_`)
are dropped, everything else is kept as written.

One pass over the text and one over its delimiter runs, each run pushed and popped at most once, so
the cost is linear in the length whatever the text (a `re` with nested groups could backtrack).
Emphasis inside a word is not taken as emphasis, for `*` too (unlike CommonMark): in `17*23*2` the
asterisks are arithmetic. Code spans are left exactly as written.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import defaultdict, deque
from dataclasses import dataclass

_SPECIAL_RE = re.compile(r"[\\`*_]")  # one character class: a linear search
_ESCAPABLE = "\\`*_"
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


def _is_punctuation(ch: str) -> bool:
    if ch < "\x80":
        return ch in _ASCII_PUNCTUATION
    return unicodedata.category(ch)[0] in "PS"


def _run(text: str, start: int, end: int) -> _Run:
    """A delimiter run text[start:end], with CommonMark's flanking rules (no intraword emphasis)."""
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    left = not after.isspace() and (not _is_punctuation(after) or before.isspace() or _is_punctuation(before))
    right = not before.isspace() and (not _is_punctuation(before) or after.isspace() or _is_punctuation(after))
    return _Run(text[start], end - start, left and (not right or _is_punctuation(before)),
                right and (not left or _is_punctuation(after)))


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
    backticks = _backtick_runs(text)
    i = 0
    while i < len(text):
        match = _SPECIAL_RE.search(text, i)
        if match is None:
            pieces.append(text[i:])
            break
        at = match.start()
        if at > i:
            pieces.append(text[i:at])
        ch = text[at]
        end = at + 1
        if ch == "\\":
            if end < len(text) and text[end] in _ESCAPABLE:
                pieces.append(text[end])  # an escaped marker is a literal character
                end += 1
            else:
                pieces.append(ch)
        elif ch == "`":
            while end < len(text) and text[end] == "`":
                end += 1
            same = backticks[end - at]
            while same and same[0] <= at:  # runs already passed (each is dropped once)
                same.popleft()
            if same:  # a code span: kept as written, markers and all
                end = same.popleft() + (end - at)
            pieces.append(text[at:end])
        else:
            while end < len(text) and text[end] == ch:
                end += 1
            pieces.append(_run(text, at, end))
        i = end
    _pair([p for p in pieces if isinstance(p, _Run)])
    return "".join(p if isinstance(p, str) else p.text() for p in pieces)


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
