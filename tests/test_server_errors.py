"""A server's own error, however it sends it where a reply was expected, is the error the turn reports,
in the server's words (redacted, cut), and what cannot succeed is asked once only. Real servers on
loopback; the turns run in this process against the session's Redis."""

from __future__ import annotations

import json
import socket

import pytest

from agent.contract import Kind
from agent.providers import AnthropicProvider, OpenAIProvider
from agent.providers.http import ERROR_TEXT_LIMIT
from agent.providers.retry import RETRY_POLICY
from agent.runtime.loopback_server import reply, stream
from tests.conftest import FAST
from tests.scripted_server import ScriptedServer, chat_reply
from tests.sse_server import DONE, chunk, message_start, sse
from tests.test_providers import MESSAGES, SECRET, SHORT, error_of
from tests.test_turn_unit import make_turn

# llama-cpp-python's words for a prompt past the model's context (its 400 to a plain request).
CONTEXT = {"message": "Requested tokens (1203) exceed context window of 512", "type": "invalid_request_error",
           "param": "messages", "code": "context_length_exceeded"}
LLAMA_CPP = {"code": 400, "message": "the request exceeds the available context size, try increasing it",
             "type": "exceed_context_size_error", "n_prompt_tokens": 1203, "n_ctx": 512}
ANTHROPIC = {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}


def raw_stream(body: bytes):
    """A 200 event stream whose body is `body`, as it comes."""
    return stream([body])


# How each server sends its error where a reply was expected, and the words that must reach the person.
FORMS = {
    "openai data error event": ("openai", lambda: stream([chunk({"role": "assistant"}), sse({"error": CONTEXT})]),
                                CONTEXT["message"]),
    "llama.cpp error line": ("openai", lambda: raw_stream(f"error: {json.dumps(LLAMA_CPP)}\n\n".encode() + DONE),
                             LLAMA_CPP["message"]),
    "anthropic error event": ("anthropic", lambda: stream([message_start(), sse({"type": "error", "error": ANTHROPIC},
                                                                                 "error")]), ANTHROPIC["message"]),
    "200 json error body": ("openai", lambda: reply(200, {"error": CONTEXT}), CONTEXT["message"]),
    "200 json error body to anthropic": ("anthropic", lambda: reply(200, {"type": "error", "error": ANTHROPIC}),
                                         ANTHROPIC["message"]),
    "json error sent as an event stream": ("openai", lambda: raw_stream(json.dumps({"error": CONTEXT}).encode()),
                                           CONTEXT["message"]),
    "pretty json error sent as an event stream": (
        "openai", lambda: raw_stream(json.dumps({"error": LLAMA_CPP}, indent=2).encode() + b"\n"),
        LLAMA_CPP["message"]),
    "500 that says the prompt does not fit": (
        "openai", lambda: reply(500, {"error": {"message": "input exceeds the context window", "type": "server"}}),
        "input exceeds the context window"),
}


def provider_for(kind: str, server: ScriptedServer, key: str | None = None):
    if kind == "openai":
        return OpenAIProvider(server.url + "/v1", "scripted", key)
    return AnthropicProvider(server.url, "scripted", key)


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_servers_own_error_is_reported_in_its_words_and_not_retried(server, form):
    kind, action, words = FORMS[form]
    server.add(action())
    error = error_of(provider_for(kind, server))
    assert error.kind == "bad_request" and not RETRY_POLICY.retryable(error)
    assert words in error.message


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_turn_that_gets_a_servers_own_error_ends_once_quoting_it(store, server, form):
    kind, action, words = FORMS[form]
    server.add(action())
    base_url = server.url + ("/v1" if kind == "openai" else "")
    turn = make_turn(store, FAST.with_changes(provider=kind, model="scripted", base_url=base_url))
    assert turn.run() == "failed"
    state = store.read(turn.context.writer.conversation_id)
    assert len(server.requests) == 1  # never asked again: it cannot succeed
    assert state["error"]["kind"] == "bad_request"
    assert words in state["error"]["message"] and words in state["history"][-1]["content"]
    assert not [s for s in state["steps"] if s["kind"] == Kind.RETRY]


def test_a_stream_that_ends_with_nothing_in_it_is_asked_plainly_and_the_plain_error_ends_the_turn(store, server):
    # llama-cpp-python past its context: the stream ends after its role chunk, without [DONE]; the same
    # request unstreamed gets a clear 400.
    server.add(stream([chunk({"role": "assistant"})]), reply(400, {"error": CONTEXT}))
    turn = make_turn(store, FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1"))
    assert turn.run() == "failed"
    state = store.read(turn.context.writer.conversation_id)
    first, second = server.requests
    assert first.json["stream"] is True and "stream" not in second.json
    assert state["error"]["kind"] == "bad_request" and CONTEXT["message"] in state["error"]["message"]
    cut, plain = [s for s in state["steps"] if s["kind"] == Kind.MODEL]
    assert "with nothing in it" in cut["detail"]
    assert plain["unstreamed"] == "the stream before ended with nothing in it"


def test_a_stream_cut_off_after_its_text_began_is_retried_streamed(store, server):
    server.add(stream([chunk({"role": "assistant"}), chunk({"content": "Half an"})]),
               stream([chunk({"content": "Four."}), chunk(finish_reason="stop"), DONE]))
    turn = make_turn(store, FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1"))
    assert turn.run() == "done"
    assert [request.json.get("stream") for request in server.requests] == [True, True]


def test_the_servers_words_are_redacted_and_cut(server):
    long_words = f"the key {SECRET} is not allowed here; " + "x" * 2000
    server.add(stream([sse({"error": {**CONTEXT, "message": long_words}})]))
    error = error_of(provider_for("openai", server, SECRET))
    assert SECRET not in error.message and "[redacted]" in error.message
    assert len(error.message) < ERROR_TEXT_LIMIT + 100


def test_an_unknown_error_in_a_stream_is_a_server_failure_that_is_retried(server):
    server.add(stream([sse({"error": {"message": "the GPU fell over", "type": "mystery"}})]))
    error = error_of(provider_for("openai", server))
    assert (error.kind, RETRY_POLICY.retryable(error)) == ("server", True)
    assert "the GPU fell over" in error.message


def test_a_stream_of_lines_that_are_no_events_and_no_error_is_a_cut_off(server):
    server.add(raw_stream(b"Internal Server Error\n"))
    error = error_of(provider_for("openai", server))
    assert error.kind == "connection" and "ended before [DONE]" in error.message


def test_a_refused_connection_names_the_url_without_its_credentials_or_query():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = OpenAIProvider(f"http://user:hunter2@127.0.0.1:{port}/v1?api-key=q-secret#frag", "m", None)
    error = error_of(provider)
    assert error.kind == "connection" and RETRY_POLICY.retryable(error)
    assert f"http://127.0.0.1:{port}/v1" in error.message
    assert "hunter2" not in error.message and "user" not in error.message and "q-secret" not in error.message


def test_a_plain_answer_still_reads_as_one_beside_these_checks(server):
    server.add(chat_reply("Four."))
    assert provider_for("openai", server).complete(MESSAGES, [], SHORT).content == "Four."
