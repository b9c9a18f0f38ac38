"""A lone surrogate (`\\ud800`, valid JSON, not encodable as UTF-8) in any field of a provider's
response is replaced where the response enters the system, so the turn goes on and keeps its steps."""

from __future__ import annotations

import json

import pytest

from agent.conversation.store import Store
from agent.queue import new_id
from agent.runtime.loopback_server import reply
from agent.text.surrogates import REPLACEMENT, scrub, scrub_json
from agent.tools import run_tool
from tests.conftest import ask, wait_done
from tests.scripted_server import chat_reply
from tests.test_turn import scripted_config

LONE = "\\ud800"  # as a JSON escape: the body itself is plain ASCII


def raw_chat(message_json: str):
    """A Chat Completions reply whose message is given as JSON text, escapes and all."""
    body = ('{"id":"x","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop","message":'
            + message_json + "}]}")
    return reply(200, None, body=body)


def raw_tool_call(call_id: str = "call_1", name: str = "calculator", arguments: str = '{\\"expression\\": \\"2+2\\"}'):
    return raw_chat('{"role":"assistant","content":null,"tool_calls":[{"id":"' + call_id + '","type":"function",'
                    '"function":{"name":"' + name + '","arguments":"' + arguments + '"}}]}')


def test_scrub_replaces_only_lone_surrogates():
    assert scrub("a\ud800b\udfffc") == f"a{REPLACEMENT}b{REPLACEMENT}c"
    assert scrub("héllo 😀") == "héllo 😀"
    assert scrub_json({"k\ud800": ["x\udc00", 1, None, {"y": "\ud83d"}]}) == {
        f"k{REPLACEMENT}": [f"x{REPLACEMENT}", 1, None, {"y": REPLACEMENT}]}


def test_the_store_writes_a_lone_surrogate_as_a_replacement_character(store: Store):
    cid = new_id()
    store.begin_turn(cid, new_id(), {"role": "user", "content": "bad \ud800 input"}, {"status": "queued"})
    state = store.read(cid)
    assert state["history"][0]["content"] == f"bad {REPLACEMENT} input"


def test_a_tool_output_with_a_lone_surrogate_is_scrubbed(monkeypatch):
    from agent import tools

    monkeypatch.setitem(tools.REGISTRY, "echo_bad", tools.make_tool(_echo_bad))
    result = run_tool("echo_bad", json.dumps({"text": "\ud800"}), 5)
    assert result.ok and result.output == f"got {REPLACEMENT}"
    result.output.encode("utf-8")


def _echo_bad(text: str) -> str:
    """Echo the text back."""
    return f"got {text}"


@pytest.mark.usefixtures("pool")
class TestTheTurnGoesOn:
    @pytest.mark.parametrize(
        ("first", "field", "expected"),
        [
            pytest.param(raw_chat('{"role":"assistant","content":"half a pair ' + LONE + ' here"}'),
                         lambda m: m["content"], f"half a pair {REPLACEMENT} here", id="content"),
            pytest.param(raw_tool_call(arguments='{\\"expression\\": \\"2+2' + LONE + '\\"}'),
                         lambda m: m["tool_calls"][0]["function"]["arguments"],
                         f'{{"expression": "2+2{REPLACEMENT}"}}', id="arguments"),
            pytest.param(raw_tool_call(arguments='{\\"expression\\": \\"\\\\ud800\\"}'),
                         lambda m: m["tool_calls"][0]["function"]["arguments"],
                         '{"expression": "\\ud800"}', id="arguments-escaped-twice"),
            pytest.param(raw_tool_call(call_id="call_" + LONE), lambda m: m["tool_calls"][0]["id"],
                         f"call_{REPLACEMENT}", id="tool-call-id"),
            pytest.param(raw_tool_call(name="calculator" + LONE),
                         lambda m: m["tool_calls"][0]["function"]["name"], f"calculator{REPLACEMENT}",
                         id="tool-name"),
        ],
    )
    def test_a_lone_surrogate_in_a_response_field_does_not_end_the_turn(
        self, store, queue, scripted, first, field, expected
    ):
        scripted.add(first, chat_reply("all good"))
        cid = ask(store, queue, "hi", scripted_config(scripted))
        state = wait_done(store, cid)
        assert state["status"] == "done", state["history"][-1]
        assert [s["outcome"] for s in state["steps"] if s["kind"] == "model"][0] == "ok"
        # The model's step is kept, with the surrogate replaced.
        assert field(state["history"][1]) == expected
        if "tool_calls" in state["history"][1]:  # the tool's result went back to the model as UTF-8
            sent = scripted.requests[1].json["messages"]
            assert sent[-1]["role"] == "tool"
            assert sent[-1]["tool_call_id"] == state["history"][1]["tool_calls"][0]["id"]

    def test_a_lone_surrogate_in_a_providers_error_text_still_ends_with_that_error(self, store, queue, scripted):
        scripted.add(reply(400, None, body='{"error": {"message": "bad ' + LONE + ' request"}}'))
        cid = ask(store, queue, "hi", scripted_config(scripted))
        state = wait_done(store, cid)
        assert state["status"] == "failed"
        assert state["error"]["kind"] == "bad_request"
        assert f"bad {REPLACEMENT} request" in state["history"][-1]["content"]
