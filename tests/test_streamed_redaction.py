"""A key split across stream reads, in every form the redaction reads, at every offset: the text handed
on (what the live text in Redis can hold at any moment, and what the CLI prints of it), a cut call's
`partial_text`, the history message and the page's rendering of each never read as the key; the cost
stays linear; and end to end through a real SSE server, real workers and a real Redis.

The oracle is tests.test_redaction's `readable` (the standard library's reading), not agent.text.redaction's."""

from __future__ import annotations

import html
import random
import re
import threading
import time

import pytest

from agent.conversation.keys import Keys
from agent.providers.base import Completion
from agent.providers.streaming import TextRelay
from agent.text.markdown import safe_markdown
from agent.text.plain_text import PlainTextStream
from agent.text.redaction import REDACTED, cut, redact
from agent.turn.model_calls import partial_fields
from agent.turn.response_limits import bound_response
from agent.turn.writer import LiveText
from tests.conftest import CANARY_KEY, FAST, ask, cpu_seconds, redis_dump, repeated, wait_done
from tests.sse_server import DONE, text_chunks
from tests.test_markdown import parsed_html
from tests.test_redaction import INVISIBLE, encode_key, readable, readable_forms_stored, seen

KEY = CANARY_KEY
# References a browser takes without `;`, for the characters that have one.
LEGACY = {"a": "&ordf", "o": "&ordm", "1": "&sup1", "2": "&sup2", "3": "&sup3"}


def _each(form) -> str:
    return "".join(form(char) for char in KEY)


# Every way the redaction reads a key, each writing the whole key (mixed forms come from encode_key).
FORMS = {
    "decimal references": _each(lambda c: f"&#{ord(c)};"),
    "decimal references without ;": _each(lambda c: f"&#{ord(c)}"),
    "decimal references with leading zeros": _each(lambda c: f"&#000{ord(c)};"),
    "hex references": _each(lambda c: f"&#x{ord(c):x};"),
    "hex references without ;": _each(lambda c: f"&#X{ord(c):X}"),
    "named references": _each(lambda c: f"&{c}opf;" if c.isalpha() else c),
    "legacy names without ;": _each(lambda c: LEGACY.get(c, c)),
    "fullwidth": _each(lambda c: chr(ord(c) + 0xFEE0)),
    "upper case": KEY.upper(),
    "alternating case": "".join(c.upper() if i % 2 else c for i, c in enumerate(KEY)),
    "zero-width spaces": "\u200b".join(KEY),
    "soft hyphens": "\u00ad".join(KEY),
    "soft hyphen references": "&shy;".join(KEY),
    "format and ignorable characters": "".join(c + INVISIBLE[i % len(INVISIBLE)] for i, c in enumerate(KEY[:-1]))
    + KEY[-1],
    "emphasis": f"{KEY[:1]}*{KEY[1:5]}*{KEY[5:9]}**{KEY[9:12]}**{KEY[12:]}",
    "underscore emphasis": f"{KEY[:3]}_{KEY[3:9]}_{KEY[9:]}",
    "strikethrough": f"{KEY[:1]}~~{KEY[1:4]}~~{KEY[4:]}",
    "code spans": f"{KEY[:1]}`{KEY[1:4]}`{KEY[4:]}",
    "escaped hyphens": KEY.replace("-", "\\-"),
    **{f"mixed {seed}": encode_key(KEY, random.Random(seed)) for seed in range(4)},
}
BEFORE, AFTER = "Your key: ", ". Keep it safe."
EXPECTED = BEFORE + REDACTED + AFTER
SPLIT_OF_ONE_PIECE = 12  # characters: a third read starts at most this far after the second (any reference)


def reads_as_key(text: str) -> bool:
    return KEY.casefold() in readable(text)


class Destinations:
    """Where a streamed text goes: every live text Redis can hold (each join of the first pieces
    handed on, which the CLI prints as they settle), a cut call's partial_text, the history message."""

    def __init__(self, reads: list[str]) -> None:
        self.handed_on: list[str] = []
        relay = TextRelay(self.handed_on.append, KEY)
        self.partials = []
        for text in reads:
            relay.add(text)
            relay.flush()
            so_far = "".join(self.handed_on)
            self.partials.append(partial_fields(so_far, len(so_far)).get("partial_text", ""))
        self.message = bound_response(Completion(relay.finish())).completion.content

    def live_texts(self) -> list[str]:
        return ["".join(self.handed_on[:count]) for count in range(1, len(self.handed_on) + 1)]

    def leaks(self) -> list[str]:
        return [text for text in (*self.live_texts(), *self.partials, self.message) if reads_as_key(text)]


def test_every_form_writes_the_key_as_a_person_reads_it():
    for name, written in FORMS.items():
        assert reads_as_key(written), name
        assert redact(BEFORE + written + AFTER, KEY) == EXPECTED, name


@pytest.mark.parametrize("form", FORMS)
def test_a_key_split_at_any_offset_across_two_reads_is_never_stored_or_shown_readable(form):
    text = BEFORE + FORMS[form] + AFTER
    for at in range(len(text) + 1):
        seen_at = Destinations([text[:at], text[at:]])
        assert seen_at.leaks() == [], (form, at, seen_at.handed_on)
        assert seen_at.message == EXPECTED, (form, at)


@pytest.mark.parametrize("form", FORMS)
def test_a_key_split_across_three_reads_is_never_stored_or_shown_readable(form):
    # The second cut anywhere within SPLIT_OF_ONE_PIECE of the first: every way to cut one reference
    # (or a run of marks) in three, at every place of the text.
    text = BEFORE + FORMS[form] + AFTER
    for first in range(len(text) + 1):
        for second in range(first, min(first + SPLIT_OF_ONE_PIECE, len(text)) + 1):
            seen_at = Destinations([text[:first], text[first:second], text[second:]])
            assert seen_at.leaks() == [], (form, first, second, seen_at.handed_on)
            assert seen_at.message == EXPECTED, (form, first, second)


def test_a_key_sent_one_character_a_read_is_never_stored_or_shown_readable():
    for form, written in FORMS.items():
        seen_at = Destinations(list(BEFORE + written + AFTER))
        assert seen_at.leaks() == [] and seen_at.message == EXPECTED, form


def test_text_is_handed_on_at_once_when_it_cannot_be_part_of_the_key():
    handed_on: list[str] = []
    relay = TextRelay(handed_on.append, KEY)
    relay.add("Hello &amp; welcome; sk is short for ")  # `sk` ends in a space: no key goes on from it
    relay.flush()
    relay.add("skip, &#115")  # may go on as `&#1150`, or as the key: held
    relay.flush()
    assert "".join(handed_on) == "Hello &amp; welcome; sk is short for skip, "
    relay.add("0; done")
    relay.flush()
    assert relay.finish() == "Hello &amp; welcome; sk is short for skip, &#1150; done" == "".join(handed_on)


def test_the_start_of_a_key_never_completed_is_handed_on_at_the_end():
    seen_at = Destinations(["key &#115;&#107;-canary", "\u200b-7f3a"])
    assert seen_at.message == "key &#115;&#107;-canary\u200b-7f3a" == "".join(seen_at.handed_on)


def test_a_reference_of_a_million_leading_zeros_then_the_key_is_redacted_whole():
    zeros = "&#" + "0" * 1_000_000
    reads = [zeros[i:i + 1000] for i in range(0, len(zeros), 1000)] + ["115", KEY[1:], " end"]
    seen_at = Destinations(reads)
    assert seen_at.message == REDACTED + " end" and seen_at.leaks() == []


def test_what_the_page_draws_of_every_stored_text_never_shows_the_key():
    texts = set()
    for written in FORMS.values():
        text = BEFORE + written + AFTER
        for at in range(len(text) + 1):
            seen_at = Destinations([text[:at], text[at:]])
            texts.update(seen_at.live_texts() + seen_at.partials + [seen_at.message])
    texts = sorted(texts)
    pages = parsed_html([safe_markdown(text) for text in texts])
    shown = [(text, page) for text, page in zip(texts, pages, strict=True)
             if KEY.casefold() in seen(html.unescape(re.sub(r"<[^>]*>", "", page)))]
    assert shown == []
    assert any(REDACTED in page for page in pages)


def test_what_the_cli_prints_of_the_live_text_never_reads_as_the_key():
    for form, written in FORMS.items():
        text = BEFORE + written + AFTER
        for at in range(len(text) + 1):
            seen_at = Destinations([text[:at], text[at:]])
            stream = PlainTextStream()
            printed = "".join(stream.feed(live) for live in seen_at.live_texts()) + stream.finish(seen_at.message)
            assert not reads_as_key(printed), (form, at, printed)


# -- cuts of a redacted text -----------------------------------------------------------------------

# Texts that do not read as the key, whose every cut that splits the last reference would.
NEAR_KEYS = [KEY[:-1] + "&#480;", KEY[:-1] + "&#x300;", KEY[:-1] + "&#00048" + "9" * 8, KEY[:-2] + "&#56;&#48" + "1",
             KEY[:-1] + "&#X30A", "&#115;&#107;" + KEY[2:-1] + "&#0480"]


@pytest.mark.parametrize("text", NEAR_KEYS)
def test_a_cut_at_any_length_ends_before_a_reference_it_would_split(text):
    assert not reads_as_key(text) and redact(text, KEY) == text
    bare_slices_read_as_key = 0
    for limit in range(len(text) + 2):
        kept = cut(text, limit)
        assert text.startswith(kept) and len(kept) <= limit
        assert not reads_as_key(kept), (limit, kept)
        assert readable(text).startswith(readable(kept)), (limit, kept)
        bare_slices_read_as_key += reads_as_key(text[:limit])
    assert bare_slices_read_as_key  # the slice cut there would have shown the key


def test_a_cut_that_splits_no_reference_is_the_plain_slice():
    text = "a &amp; b &#115; c &ampx d " * 3
    for limit in range(len(text) + 1):
        kept = cut(text, limit)
        assert kept == text[:limit] or (text[len(kept)] == "&" and len(kept) > limit - len("&#115;"))


@pytest.mark.parametrize("text", NEAR_KEYS)
def test_every_cut_a_turn_makes_keeps_a_split_reference_out(text, store):
    long_text = "x" * 10 + text
    limit = len(long_text) - 2  # inside the last reference
    live = LiveText(store, "c-none", "t-none", max_chars=limit)
    on_text = live.start(0, 1)
    on_text(long_text[:7])
    on_text(long_text[7:])
    on_text(after := "more text, never added after a cut")
    _, kept, arrived = live.end()
    assert kept == cut(long_text, limit) and not reads_as_key(kept) and arrived == len(long_text + after)
    assert not reads_as_key(partial_fields(long_text, len(long_text))["partial_text"])
    content = bound_response(Completion("y" * (100_000 - len(text) + 2) + text)).completion.content
    assert not reads_as_key(content.split("\n\n[The reply was cut here")[0])


# -- cost ------------------------------------------------------------------------------------------

MB2 = 2_000_000  # characters
SMALL_READ_CHARS = 100  # what one network read of a fast server may carry
STREAM_BOUND_S = 2.0  # CPU seconds for 2 MB in 100-character reads (about 0.2 s measured)
GROWTH_BOUND = 8.0  # 4x the text may cost at most 8x the CPU time: linear is 4x, quadratic 16x
PROSE = "The quick brown fox jumps over the lazy dog; sk is not the key, nor is &amp; or &#115;. "
# Texts that make the relay hold back (a key's start, then what reads as nothing or stays open), and
# prose: each a head, then one unit over and over.
SHAPES = {"prose": ("", PROSE), "key start then invisible characters": ("sk-canary-", "\u200b"),
          "key start then invisible references": ("sk-canary-", "&shy;"), "key start then marks": ("sk-", "*"),
          "leading zeros": ("&#", "0"), "digits": ("&#1", "2"), "ampersands": ("", "&"),
          "the key again and again": ("", KEY + " ")}


def relay_seconds(text: str) -> float:
    def run(whole: str) -> None:
        relay = TextRelay(None, KEY)
        for start in range(0, len(whole), SMALL_READ_CHARS):
            relay.add(whole[start:start + SMALL_READ_CHARS])
            relay.flush()
        relay.finish()
    return cpu_seconds(run, text)


@pytest.mark.parametrize("shape", SHAPES)
def test_two_megabytes_streamed_in_small_reads_are_redacted_in_linear_time(shape):
    head, unit = SHAPES[shape]
    quarter, whole = (relay_seconds(head + repeated(unit, size)) for size in (MB2 // 4, MB2))
    assert whole < STREAM_BOUND_S, f"{shape}: 2 MB took {whole:.2f} s"
    assert whole / max(quarter, 0.02) < GROWTH_BOUND, f"{shape}: {quarter:.3f} s -> {whole:.3f} s"


# -- end to end: a real SSE server, real workers, a real Redis ------------------------------------

# The three shapes of the report, each split at the worst place across two network reads.
STREAMED = ["Your key: &#115;&#107;", f"{KEY[2:]} and s", f"\u200b{KEY[1:]} and *s", f"*{KEY[1:]}. Done."]
STREAM_PACE_S = 0.3  # seconds between reads: each lands in its own live write (every 0.1 s at most)


@pytest.mark.usefixtures("pool")
def test_a_key_split_across_stream_reads_never_reaches_redis_readable(store, queue, scripted, redis_client, pool):
    from agent.runtime.loopback_server import stream

    events = text_chunks(*STREAMED)
    scripted.add(stream(events, STREAM_PACE_S),  # cut off before [DONE]: a retry, and the text as partial_text
                 stream([*events, DONE], STREAM_PACE_S))
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1", job_timeout_s=20)
    cid = ask(store, queue, "hi", config)
    live_seen: set[bytes] = set()
    stop = threading.Event()

    def watch() -> None:  # every value the live text takes (each lasts at least a pace)
        while not stop.is_set():
            value = redis_client.get(Keys.of(cid).live)
            if value:
                live_seen.add(value)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        state = wait_done(store, cid, timeout_s=40)
    finally:
        stop.set()
        watcher.join()
    assert state["status"] == "done", state
    assert state["history"][-1]["content"] == f"Your key: {REDACTED} and {REDACTED} and *{REDACTED}. Done."
    cut_step = next(step for step in state["steps"] if "partial_text" in step)
    assert cut_step["partial_text"] == state["history"][-1]["content"]  # all had arrived, and was handed on
    assert len(live_seen) >= 4, live_seen  # the live text was seen growing, in both attempts
    assert [text for text in live_seen if reads_as_key(text.decode())] == []
    assert readable_forms_stored(redis_dump(redis_client)) == []
    for text in [*(t.decode() for t in live_seen), state["history"][-1]["content"], cut_step["partial_text"]]:
        assert not reads_as_key(safe_markdown(text))
    assert not reads_as_key(pool.log_path.read_text(errors="replace"))
