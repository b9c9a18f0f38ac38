"""Key redaction as a person reads the text: character references, invisible characters, compatibility
forms and case, fuzzed per character; linear time; and a hostile provider through a real worker.

The oracle is the standard library's own reading (html.unescape, NFKC, casefold, category Cf), not
agent.text.redaction's."""

from __future__ import annotations

import html
import json
import random
import unicodedata

import pytest

from agent.providers.http import redact, redact_json
from agent.runtime.loopback_server import reply
from agent.text.redaction import REDACTED
from tests.conftest import CANARY_KEY, FAST, ask, cpu_seconds, redis_dump, repeated, wait_done
from tests.scripted_server import chat_reply, tool_call

FUZZ_SEED = 20261203
FUZZ_CASES = 3000
LINEAR_TEXT_CHARS = 2**20  # 1 MB of text
LINEAR_BOUND_S = 2.0  # CPU seconds for 1 MB of any text (0.15 to 0.7 s measured; a quadratic scan takes minutes)
# Drawn as nothing: format characters (Cf) and other default-ignorable code points.
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060", "\u2061", "\u2062", "\u2063", "\u2064",
             "\ufeff", "\u00ad", "\u034f", "\u180e", "\u202a", "\u202c", "\u2066", "\u2069", "\ufe0f", "\U000e0020"]
INVISIBLE_REFERENCES = ["&shy;", "&shy", "&ZeroWidthSpace;", "&zwj;", "&zwnj;", "&lrm;", "&rlm;", "&NoBreak;",
                        "&it;", "&ic;", "&af;", "&#8203;", "&#x200B", "&#X2060;", "&#173"]
FILLER = ["hello", "world", "the", "key", "is", "sk", "canary", "&", "&amp;", "&lt;", "&#", "&#x", "&;", "é",
          "ｗｏｒｌｄ", "\u200b", "&notit;", "&#0;", "7f3a", "SK-", "-", "\U0001d542", "ǆ", "ß"]


MARKDOWN_WRAPS = ["**", "*", "~~", "`", "_"]  # drawn as nothing around part of a word on the page


def readable(text: str) -> str:
    """What a person reads: references decoded by the standard library, NFKC, case folded, nothing
    invisible, no Markdown emphasis, strikethrough, code span or escape marks."""
    return seen(html.unescape(text))


def seen(text: str) -> str:
    """What a person reads in text a page shows as it is (its references already decoded)."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return "".join(c for c in folded if c not in INVISIBLE and c not in "*_~`\\" and unicodedata.category(c) != "Cf")


def encode_char(char: str, next_raw: str, rng: random.Random) -> str:
    """One character of the key, written the way the fuzz picks (each a form a page shows as it)."""
    options = ["literal", "case", "decimal", "hex"]
    if 0x21 <= ord(char) <= 0x7E:
        options.append("fullwidth")
    if char.isalpha():
        options += ["double-struck", "script", "fraktur"]
    form = rng.choice(options)
    if form == "literal":
        return char
    if form == "case":
        return char.swapcase()
    if form == "fullwidth":
        return chr(ord(char) + 0xFEE0)
    if form in ("double-struck", "script", "fraktur"):
        suffix = {"double-struck": "opf", "script": "scr", "fraktur": "fr"}[form]
        return f"&{rng.choice([char.lower(), char.upper()])}{suffix};"
    # Without its `;` only where the next character cannot be read as more digits.
    if form == "decimal":
        semicolon = ";" if next_raw.isdigit() or rng.random() < 0.5 else ""
        return f"&#{'0' * rng.randint(0, 3)}{ord(char)}{semicolon}"
    semicolon = ";" if next_raw in "0123456789abcdefABCDEF" or rng.random() < 0.5 else ""
    digits = f"{ord(char):x}"
    return f"&#{rng.choice('xX')}{'0' * rng.randint(0, 2)}{rng.choice([digits, digits.upper()])}{semicolon}"


def encode_key(key: str, rng: random.Random) -> str:
    written = [encode_char(char, key[i + 1] if i + 1 < len(key) else " ", rng) for i, char in enumerate(key)]
    if len(written) > 2 and rng.random() < 0.3:  # Markdown around a run of plain characters: `sk-ca**na**ry`, `\-`
        start = rng.randrange(1, len(written) - 1)  # inside the key: a mark at its edge is not part of it
        end = start
        while end < len(written) - 1 and len(written[end]) == 1 and written[end].isascii() and end - start < 6:
            end += 1
        if end > start:
            wrap = rng.choice(MARKDOWN_WRAPS)
            written[start] = wrap + written[start]
            written[end - 1] = written[end - 1] + wrap
        written = ["\\-" if piece == "-" and rng.random() < 0.5 else piece for piece in written]
    pieces = [written[0]]
    for piece in written[1:]:
        if rng.random() < 0.3:
            # A reference without its `;` only where what follows cannot be read as more of its name or digits.
            choices = INVISIBLE + [r for r in INVISIBLE_REFERENCES if r.endswith(";") or not piece[0].isalnum()]
            pieces.append("".join(rng.choice(choices) for _ in range(rng.randint(1, 3))))
        pieces.append(piece)
    return "".join(pieces)


def filler(rng: random.Random) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(rng.randint(0, 12)))


def test_a_key_written_in_any_mix_of_references_invisible_characters_compatibility_forms_and_case_is_redacted_whole():
    rng = random.Random(FUZZ_SEED)
    for _ in range(FUZZ_CASES):
        written = encode_key(CANARY_KEY, rng)
        assert CANARY_KEY.casefold() in readable(written)  # the fuzz writes the key as a page would show it
        before, after = filler(rng) + " ", " " + filler(rng)
        assert redact(before + written + after, CANARY_KEY) == before + REDACTED + after, written


def test_text_that_does_not_read_as_the_key_is_left_unchanged():
    rng = random.Random(FUZZ_SEED + 1)
    for _ in range(FUZZ_CASES):
        key = list(CANARY_KEY)
        change = rng.choice(["replace", "drop", "insert visible", "truncate"])
        at = rng.randrange(1, len(key) - 1)
        if change == "replace":
            key[at] = rng.choice([c for c in "xyz.#q" if c != key[at]])
        elif change == "drop":
            del key[at]
        elif change == "insert visible":
            key.insert(at, rng.choice([" ", ".", "x", "&amp;", "\u00e9", "&#x20;"]))
        else:
            key = key[:at]
        near_miss = encode_key("".join(key), rng) if rng.random() < 0.5 else "".join(key)
        text = filler(rng) + " " + near_miss + " " + filler(rng)
        assert CANARY_KEY.casefold() not in readable(text)
        assert redact(text, CANARY_KEY) == text


def test_redact_json_reads_every_string_and_key_of_a_reply():
    rng = random.Random(FUZZ_SEED + 2)
    encoded = [encode_key(CANARY_KEY, rng) for _ in range(4)]
    value = {"content": f"key {encoded[0]}", encoded[1]: [encoded[2], {"n": 1, "s": encoded[3]}]}
    expected = {"content": f"key {REDACTED}", REDACTED: [REDACTED, {"n": 1, "s": REDACTED}]}
    assert redact_json(value, CANARY_KEY) == expected


LINEAR_PATTERNS = ["a", "&#107;", "&#1", "&ab", "&a;", "&kopf;", "&notit;", "\u200b", "é", "aé", "ｓ", "ǆ", "&#x",
                   "&" + "a" * 40, "&#" + "9" * 30, CANARY_KEY, "s\u200bk-canary-7f3a9c1e5b2d4680 ",
                   "ｓ\u200bｋ-canary-7f3a9c1e5b2d4680", "&#115;&#107;-canary-7f3a9c1e5b2d468", "*", "*a", "`\\",
                   "sk-ca**na**ry-7f3a9c1e5b2d4680 ", CANARY_KEY + "&amp;", CANARY_KEY + "é"]


@pytest.mark.parametrize("pattern", LINEAR_PATTERNS)
def test_a_megabyte_of_any_text_redacts_in_well_under_a_second(pattern):
    assert cpu_seconds(lambda text: redact(text, CANARY_KEY), repeated(pattern, LINEAR_TEXT_CHARS)) < LINEAR_BOUND_S


def test_a_megabyte_of_distinct_references_and_characters_redacts_in_well_under_a_second():
    rng = random.Random(FUZZ_SEED + 3)
    references = "".join(f"&#{rng.randrange(10**6)};" for _ in range(LINEAR_TEXT_CHARS // 8))
    characters = "".join(chr(rng.randrange(0x100, 0x30000)) for _ in range(LINEAR_TEXT_CHARS))
    with_keys = characters[: LINEAR_TEXT_CHARS // 2] + CANARY_KEY + characters[LINEAR_TEXT_CHARS // 2:]
    for text in (references, characters, with_keys):
        assert cpu_seconds(lambda t: redact(t, CANARY_KEY), text) < LINEAR_BOUND_S


# -- a hostile provider, through a real worker ---------------------------------------------------------


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in strings_in(item)]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [key, *strings_in(item)]]
    return []


def readable_forms_stored(dump: bytes) -> list[str]:
    """Every stored value (each JSON string in it, or its text) that a person would read as the key."""
    found = []
    for part in dump.split(b"\n"):
        text = part.decode("utf-8", "replace")
        try:
            texts = strings_in(json.loads(text)) + [text]
        except ValueError:
            texts = [text]
        found += [t for t in texts if CANARY_KEY.casefold() in readable(t)]
    return found


@pytest.mark.usefixtures("pool")
def test_a_key_echoed_in_references_invisible_characters_and_compatibility_forms_never_reaches_redis_readable(
    store, queue, scripted, redis_client, pool
):
    rng = random.Random(FUZZ_SEED + 4)
    forms = [encode_key(CANARY_KEY, rng) for _ in range(12)]
    calls = [tool_call(f"tool_{forms[0]}", {forms[1]: forms[2]}, call_id=f"call_{forms[3]}"),
             tool_call("calculator", {"expression": f"1+{forms[4]}"}, call_id="call_2")]
    scripted.add(
        chat_reply(f"Your key is {forms[5]} and {forms[6]}.", calls),
        reply(500, {"error": {"message": f"bad key {forms[7]}"}}, headers={"Retry-After": "0.1"}),
        reply(429, {"error": {"message": f"slow down, {forms[8]}"}}, headers={"Retry-After": "0.1"}),
        chat_reply(f"Done: {forms[9]} {forms[10]}"),
    )
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1", job_timeout_s=10)
    cid = ask(store, queue, "hi", config)
    state = wait_done(store, cid, timeout_s=30)
    assert state["status"] == "done", state["history"][-1]
    assert len(scripted.requests) == 4  # every echo was received and handled
    assert all(CANARY_KEY.casefold() in readable(form) for form in forms)
    dump = redis_dump(redis_client)
    assert readable_forms_stored(dump) == []
    assert REDACTED.encode() in dump  # the echoes were kept, redacted, not dropped
    assert CANARY_KEY.casefold() not in readable(pool.log_path.read_text(errors="replace"))
