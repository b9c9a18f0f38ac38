"""The CLI's plain text: emphasis markers dropped, arithmetic and code kept, linear on any input."""

from __future__ import annotations

import random

import pytest

from agent.text.plain_text import plain_text
from tests.conftest import cpu_seconds, repeated

LARGE_CHARS = 160_000  # characters of a pathological input
SMALL_CHARS = LARGE_CHARS // 4
GROWTH_BOUND = 8  # four times the input may cost at most this many times the time (quadratic: 16)
CPU_S_PER_MB = 4.0  # CPU seconds per million characters: the worst pattern takes about 2 s on this busy machine
TIMING_FLOOR_S = 0.005  # a small input faster than this is noise: the growth is taken against this


@pytest.mark.parametrize(
    ("markdown", "plain"),
    [
        ("**17*23 = 391**", "17*23 = 391"),
        ("**2**3 = 8**", "2**3 = 8"),
        ("*a* _b_ **c** __d__ ***e***", "a b c d e"),
        ("5 * 3 = 15 and 2*3*4", "5 * 3 = 15 and 2*3*4"),
        ("snake_case_name stays", "snake_case_name stays"),
        ("`a *b* c` and *d*", "`a *b* c` and d"),
        ("``x ` y`` **z**", "``x ` y`` z"),
        ("\\*not emphasis\\*", "*not emphasis*"),
        ("**unclosed and *half", "**unclosed and *half"),
        ("", ""),
        (None, ""),
    ],
)
def test_emphasis_markers_are_dropped_and_everything_else_is_kept(markdown, plain):
    assert plain_text(markdown) == plain


def test_text_without_markers_is_returned_unchanged():
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice("ab 12+-/=.,:;()[]#>\n\té日\ud800") for _ in range(rng.randint(0, 80)))
        assert plain_text(text) == text


def _best_of_three(text: str) -> float:
    """CPU seconds of this thread for plain_text(text), the best of three (see tests.conftest.cpu_seconds)."""
    return cpu_seconds(plain_text, text, repeats=3)


PATTERNS = ["*a", "_*", "*_ ", "a*b ", "**", "** x", " **x", "`", "``a", "\\*", "*`", "_a_b", "***a", "* a*"]


@pytest.mark.parametrize("pattern", PATTERNS + ["random"])
def test_plain_text_takes_linear_time_on_pathological_input(pattern):
    rng = random.Random(pattern)

    def make(chars: int) -> str:
        if pattern == "random":
            return "".join(rng.choice("*_` \\a\n") for _ in range(chars))
        return repeated(pattern, chars)

    small_text, large_text = make(SMALL_CHARS), make(LARGE_CHARS)
    small, large = _best_of_three(small_text), _best_of_three(large_text)
    if large >= GROWTH_BOUND * max(small, TIMING_FLOOR_S):  # measured once more, side by side, before failing
        small, large = min(small, _best_of_three(small_text)), min(large, _best_of_three(large_text))
    assert large < GROWTH_BOUND * max(small, TIMING_FLOOR_S), (pattern, small, large)
    assert large < CPU_S_PER_MB * LARGE_CHARS / 1_000_000, (pattern, large)
