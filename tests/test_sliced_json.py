"""A reply's JSON decoded in bounded steps (agent/providers/sliced_json.py and bulk_redaction.py):
the same value as `json.loads` then the per-string scrub and redaction, the same refusals, and a
cost that grows linearly. Pure logic, no I/O."""

from __future__ import annotations

import json
import random

import pytest

from agent.providers import bulk_redaction, sliced_json
from agent.providers.http import redact_json
from agent.text.surrogates import scrub_json
from tests.conftest import CANARY_KEY, cpu_seconds
from tests.test_redaction import encode_key

# Characters a string may hold: the awkward ones for a parser (quotes, backslashes, controls, the
# separators the cleaning joins strings with) and for the redaction (references, invisible and
# compatibility characters, lone surrogates).
SEEDS = 200  # random bodies per fuzz test (4000 passed once, by hand)

ALPHABET = ['"', "\\", "/", "\n", "\t", "\0", "\1", "\x1f", "&", "#", ";", "a", "Z", "7", " ", "é", "\u0301",
            "\u200b", "ｓ", "中", "\U0001d42c", "\ud800", "\udc00", "&amp;", "&#107;", "*", "_"]


def random_text(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return encode_key(CANARY_KEY, rng)  # the key, written any way a person still reads it
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 12)))


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 5 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 12345678901234567890, 1.5, -2.5e-8, 1e300])
    if kind in (2, 3, 4, 5):
        return random_text(rng)
    if kind in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))]
    return {random_text(rng): random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def serialized(value, rng: random.Random) -> str:
    return json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 0, 2]),
                      separators=rng.choice([None, (",", ":"), (" , ", " : ")]))


def decoded(body, secret=CANARY_KEY):
    steps = sliced_json.decode_steps(body, secret)
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, count
        count += 1


def parsed(body):
    steps = sliced_json.parse_steps(body)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def expected(body, secret=CANARY_KEY):
    return redact_json(scrub_json(json.loads(body)), secret)


@pytest.fixture
def small_steps(monkeypatch):
    """Every body parsed in steps, runs cut off every few characters: each seam is exercised."""
    monkeypatch.setattr(sliced_json, "ONE_STEP_CHARS", 0)
    monkeypatch.setattr(sliced_json, "RUN_CHARS", 37)
    monkeypatch.setattr(bulk_redaction, "BATCH_CHARS", 50)
    monkeypatch.setattr(bulk_redaction, "BATCH_ITEMS", 7)
    monkeypatch.setattr(bulk_redaction, "PIECE_CHARS", 40)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_body_decodes_in_steps_to_what_json_loads_and_the_per_string_redaction_give(seed, small_steps):
    rng = random.Random(seed)
    body = serialized(random_value(rng), rng)
    assert decoded(body)[0] == expected(body)
    assert decoded(body, None)[0] == expected(body, None)
    assert decoded(body.encode("utf-8", "surrogatepass"))[0] == expected(body.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_damaged_body_is_refused_exactly_when_json_loads_refuses_it(seed, small_steps):
    rng = random.Random(seed)
    body = serialized(random_value(rng), rng)
    at = rng.randrange(len(body) + 1)
    damaged = rng.choice([body[:at] + body[at + 1:], body[:at] + rng.choice('[]{},:"\\0e-. x') + body[at:]])
    try:
        want = json.loads(damaged)
    except ValueError:
        with pytest.raises(ValueError):
            parsed(damaged)
    else:
        assert parsed(damaged) == want


@pytest.mark.parametrize("body", [
    '[1, 2', '[1,]', '{"a" 1}', '{"a": 1,}', '[01]', '[1.]', '["a\nb"]', '["\\x"]', '[tru]', '{1: 2}',
    '[1] [2]', '"unterminated', "\ufeff[1]", "", " ", '[-]', '[1e]', '{"a":[}', '[' * 20 + ']' * 19,
])
def test_malformed_json_is_refused_in_steps_as_json_loads_refuses_it(body, small_steps):
    with pytest.raises(ValueError):
        json.loads(body)
    with pytest.raises(ValueError):
        parsed(body)


def test_a_number_cut_by_the_end_of_a_run_is_read_whole(small_steps):
    body = json.dumps([123456789012345, -1.25e-7, 10**40, 7] * 40)
    assert parsed(body) == json.loads(body)


def test_a_repeated_key_keeps_its_first_place_and_its_last_value_as_json_loads_does(small_steps):
    body = '{"a": 1, "b": [2], "a": {"c": 3}, "b": 4, "d": 5, "a": 6}'
    assert list(parsed(body).items()) == list(json.loads(body).items())


def test_keys_that_read_the_same_once_redacted_merge_as_the_per_string_redaction_merges_them(small_steps):
    body = json.dumps({CANARY_KEY: 1, "x": 2, CANARY_KEY.upper(): 3, "&#115;" + CANARY_KEY[1:]: [4]})
    assert list(decoded(body)[0].items()) == list(expected(body).items()) == [("[redacted]", [4]), ("x", 2)]


def test_nesting_deeper_than_the_bound_is_refused():
    depth = sliced_json.MAX_DEPTH + 1
    body = "[" * depth + "]" * depth
    with pytest.raises(ValueError):
        parsed(body + " " * sliced_json.ONE_STEP_CHARS)


def test_a_key_spelled_across_a_long_strings_pieces_is_still_found(small_steps):
    # The key starts in one piece and ends in the next, with invisible characters at the seam.
    text = "x" * 38 + CANARY_KEY[:5] + "\u200b" * 3 + CANARY_KEY[5:] + " tail"
    assert decoded(json.dumps([text]))[0] == ["x" * 38 + "[redacted] tail"]


def short_strings_body(count: int) -> bytes:
    """A reply padded with `count` two-letter strings: the shape that made per-string redaction cost 12 s."""
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}], "pad": ["ab"] * count},
                      separators=(",", ":")).encode()


def test_eight_mebibytes_of_short_strings_decode_in_many_small_steps():
    body = short_strings_body(1_700_000)
    value, steps = decoded(body)
    assert value["pad"][-1] == "ab" and len(value["pad"]) == 1_700_000
    # No step reads more than a run or a batch: hundreds of them, each a few milliseconds.
    assert steps >= len(body) // max(sliced_json.RUN_CHARS, bulk_redaction.BATCH_CHARS)


@pytest.mark.parametrize("shape", ["plain", "with the key echoed"])
def test_the_cost_of_decoding_with_a_key_grows_linearly_with_the_number_of_strings(shape):
    def body(count: int) -> bytes:
        if shape == "plain":
            return short_strings_body(count)
        return json.dumps(["ab", "\u00e9", CANARY_KEY] * (count // 3)).encode()

    def decode(data: bytes):
        decoded(data)

    small, large = 100_000, 400_000
    small_s = cpu_seconds(decode, body(small), repeats=3)
    large_s = cpu_seconds(decode, body(large), repeats=3)
    # Four times the strings: four times the time, with room for a busy machine, never sixteen.
    assert large_s < 4 * small_s * 2.0 + 0.05, (small_s, large_s)
