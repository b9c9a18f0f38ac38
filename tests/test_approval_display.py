"""What a person approves is exactly what runs: a request shows a call's arguments as the tool receives
them (decoded, each key once, whole, every character a reader would not see as its escape), on the page,
in the CLI and in the export; arguments that cannot be shown whole are refused unasked
(agent/turn/approvals.py shown_arguments, agent/text/visible.py).

The class is fuzzed (padding, duplicate keys at any depth, long values, JSON escapes, zero-width, tag and
bidirectional characters, nesting) against the tool's own decoding (agent/tools/registry.py); the
integration tests run a scripted model on loopback and the session's real Redis and pool.
"""

from __future__ import annotations

import json
import random

import pytest

from agent.contract import Outcome, Status
from agent.conversation import export
from agent.providers.base import ToolCall
from agent.text.plain_text import terminal_safe
from agent.text.visible import hidden, shown_json_text, visible, visible_json
from agent.tools.registry import ToolError, decode_arguments
from agent.turn import approvals
from agent.turn.approvals import BY_PAGE, MAX_SHOWN_CHARS, refusal_unless_shown, shown_arguments
from tests.conftest import FAST, ask, wait_done
from tests.scripted_server import chat_reply, tool_call
from tests.test_app import app_env  # noqa: F401 - the page's environment
from tests.test_approvals import parked, tool_results

# A harmless first value, 1,990 newlines of padding, and the value the tool gets.
PADDED_TWICE = '{"text": "remember to water the plants"' + "\n" * 1990 + ', "text": "EVIL payload"}'
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "\u202e000,01$" reads "$10,000"
HIDDEN_SAMPLES = ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f", "\u061c",
                  "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u180e", "\u3164", "\ufe0f",
                  "\U000e0041", "\U000e007f", "\x1b", "\x00", "\x7f", "\x9b", "\u2028", "\u2029", "\u00a0",
                  "\ue000", "\ud800"]
PLAIN = "abc xyz 09 $,.é中😀"


def call(arguments: str, name: str = "add_note") -> ToolCall:
    return ToolCall(id="call_1", name=name, arguments=arguments)


def assert_shown_is_what_runs(raw: str) -> None:
    """Either the call is refused unasked (and the tool would refuse it too, or it is too long to show), or
    what is shown decodes to exactly what the tool receives, with nothing hidden in it."""
    refusal = refusal_unless_shown(call(raw))
    try:
        received = decode_arguments("add_note", raw)
    except ToolError:
        assert refusal is not None and refusal.startswith("Error: not run, and nobody was asked")
        return
    if refusal is not None:
        assert len(visible_json(received)) > MAX_SHOWN_CHARS and f"{MAX_SHOWN_CHARS:,}" in refusal
        return
    shown = shown_arguments(call(raw))
    assert json.loads(shown) == received, (raw[:200], shown[:200])
    assert not [ch for ch in shown if hidden(ch)], shown[:200]
    assert len(shown) <= MAX_SHOWN_CHARS
    # The page, the CLI and the export show the same text, whatever they are handed (idempotent).
    assert shown_json_text(shown) == shown


def test_a_key_given_twice_is_shown_once_with_the_value_the_tool_receives():
    shown = shown_arguments(call(PADDED_TWICE))
    assert json.loads(shown) == {"text": "EVIL payload"} == decode_arguments("add_note", PADDED_TWICE)
    assert "water the plants" not in shown and shown.count('"text"') == 1


def test_a_right_to_left_override_is_shown_as_its_escape_not_acted_on():
    shown = shown_arguments(call(json.dumps({"amount": RLO + "000,01$"})))
    assert RLO not in shown and "\\u202e000,01$" in shown
    assert json.loads(shown) == {"amount": RLO + "000,01$"}


@pytest.mark.parametrize("ch", HIDDEN_SAMPLES)
def test_every_hidden_character_is_made_visible_in_text_and_in_json(ch):
    assert hidden(ch)
    text = f"a{ch}b"
    assert ch not in visible(text) and "\\" in visible(text)
    encoded = visible_json({f"k{ch}": text})
    assert ch not in encoded and json.loads(encoded) == {f"k{ch}": text}


def test_what_a_reader_sees_stays_as_it_is():
    assert visible(PLAIN + "\n\t") == PLAIN + "\n\t"
    assert not [ch for ch in PLAIN + " \n\t" if hidden(ch)]


@pytest.mark.parametrize("raw", [
    PADDED_TWICE,
    '{"a": {"b": 1, "b": {"c": "x", "c": "\\u202eevil"}}, "a": {"b": 2}}',  # nested duplicates
    '{"t": "\\u202e000,01$", "z": "\\u200b\\ufeff\\u2066x\\u2069", "tag": "\\udb40\\udc41"}',  # JSON escapes
    '{"t": "\\ud800 lone surrogate", "n": "\\u0000\\u001b[31m"}',
    json.dumps({"text": "x" * 15_000}),  # long, but shown whole
    json.dumps({"text": "\u200b" * 3000}),  # short, but longer than the limit once shown
    json.dumps({"d": json.loads("[" * 60 + "]" * 60)}),  # deep, within the bound
    "[" * 70 + "]" * 70,  # too deep, and no object
    '{"a": ' * 70 + "1" + "}" * 70,
    '["not", "an object"]', '"text"', "{not json", "", "   ", "null",
    '{"t": 1e400}', '{"t": 123456789012345678901234567890}',
])
def test_a_shown_request_is_what_the_tool_receives_or_none_is_made(raw):
    assert_shown_is_what_runs(raw)


def test_fuzzed_arguments_are_shown_as_the_tool_receives_them_or_refused():
    rng = random.Random(20261205)
    alphabet = list(PLAIN) + HIDDEN_SAMPLES + ['"', "\\", "\n", " "]

    def string() -> str:
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        return json.dumps(text, ensure_ascii=rng.random() < 0.5)

    def value(depth: int) -> str:
        pick = rng.random()
        if depth > 0 and pick < 0.3:
            return obj(depth - 1)
        if depth > 0 and pick < 0.4:
            return "[" + ", ".join(value(depth - 1) for _ in range(rng.randrange(0, 3))) + "]"
        return string() if pick < 0.85 else rng.choice(["1", "-2.5", "true", "null"])

    def obj(depth: int) -> str:
        keys = [string() for _ in range(rng.randrange(0, 4))]
        keys += rng.choices(keys, k=rng.randrange(0, 3)) if keys else []  # the same key again, later
        pad = rng.choice(["", " ", "\n" * rng.randrange(0, 300), "\t"])
        return "{" + pad + ("," + pad).join(f"{k}: {value(depth)}" for k in keys) + pad + "}"

    for _ in range(400):
        assert_shown_is_what_runs(obj(rng.randrange(0, 5)))
    long_value = json.dumps({"text": "\u200b" * 2000 + "x" * 4000})  # shown longer than the limit
    assert refusal_unless_shown(call(long_value)) is not None


def test_the_export_and_the_cli_show_tool_calls_as_the_tool_receives_them():
    state = {"conversation_id": "c1", "turn_id": "t1", "history": [
        {"role": "user", "content": "note it"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("add_note", PADDED_TWICE)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}], "steps": [], "turns": [],
        "status": "done", "done": True}
    markdown = export.to_markdown(state)
    assert "EVIL payload" in markdown and "water the plants" not in markdown
    bidi = shown_json_text(json.dumps({"amount": RLO + "000,01$"}), indent=None)
    assert RLO not in terminal_safe(bidi) and "\\u202e" in bidi


# -- end to end: a scripted model asks, a person sees exactly what then runs --------------------------


def scripted_config(scripted, tool: str = "calculator"):
    return FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1",
                             approve_tools=(tool,))


def test_a_request_shows_the_value_that_runs_when_a_key_is_given_twice(pool, store, queue, scripted):
    raw = '{"expression": "1+1"' + "\n" * 1990 + ', "expression": "6*7"}'
    scripted.add(chat_reply(None, [tool_call("calculator", raw)]), chat_reply("done"))
    cid = ask(store, queue, "compute", scripted_config(scripted))
    request = parked(store, cid)["approval"]
    assert json.loads(request["arguments"]) == {"expression": "6*7"} and "1+1" not in request["arguments"]
    assert approvals.answer(store, queue, cid, Outcome.APPROVED, BY_PAGE, request_id=request["id"]).taken
    final = wait_done(store, cid)
    assert tool_results(final)[request["call_id"]] == "42"  # what was shown ran, and nothing else
    [step] = [s for s in final["steps"] if s["kind"] == "approval"]
    assert step["arguments"] == request["arguments"] and step["request_id"] == request["id"]


def test_arguments_too_long_to_show_are_refused_and_nobody_is_asked(pool, store, queue, scripted):
    raw = json.dumps({"expression": "1+1", "pad": "\u200b" * 3000})  # 6 characters each, once shown
    scripted.add(chat_reply(None, [tool_call("calculator", raw)]), chat_reply("could not"))
    cid = ask(store, queue, "compute", scripted_config(scripted))
    final = wait_done(store, cid)
    assert final["status"] == Status.DONE and not [s for s in final["steps"] if s["kind"] == "approval"]
    result = tool_results(final)["call_1"]
    assert result.startswith("Error: not run, and nobody was asked") and f"{MAX_SHOWN_CHARS:,}" in result


def test_the_page_shows_the_request_as_the_tool_receives_it(pool, store, queue, scripted, app_env):  # noqa: F811
    from tests.apptest_page import app
    from tests.test_app import assert_no_exception

    raw = '{"expression": "1+1"' + "\n" * 50 + ', "expression": "\\u202e2+1"}'
    scripted.add(chat_reply(None, [tool_call("calculator", raw)]), chat_reply("done"))
    cid = ask(store, queue, "compute", scripted_config(scripted))
    request = parked(store, cid)["approval"]
    at = app(cid)
    at.run()
    assert_no_exception(at)
    [card] = [code.value for code in at.code if "expression" in code.value]
    assert RLO not in card and "\\u202e2+1" in card and "1+1" not in card
    assert any(request["id"] in caption.value for caption in at.caption), "the card names its request"
    approvals.answer(store, queue, cid, Outcome.DENIED, BY_PAGE, request_id=request["id"])
    wait_done(store, cid)
