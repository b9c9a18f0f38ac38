"""Streamed provider calls against real HTTP servers on loopback: both formats, their faults, their bounds."""

# ruff: noqa: F811 - a test's argument named after an imported fixture is that fixture

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from agent.deadline import CallTimeout
from agent.providers import AnthropicProvider, OpenAIProvider, ProviderError
from agent.providers.base import Completion, ToolCall, Usage
from agent.providers.http import MAX_RESPONSE_BYTES
from agent.providers.retry import RETRY_POLICY
from agent.providers.sse import Event, EventStreamParser
from agent.providers.streaming import TextRelay
from agent.runtime.loopback_server import delayed, reply, stream
from tests.scripted_server import chat_reply
from tests.sse_server import (
    DONE,
    PING,
    block_delta,
    block_start,
    block_stop,
    call_delta,
    chunk,
    message_end,
    message_start,
    sse,
    text_block,
    text_chunks,
    tool_block,
    usage_chunk,
)

# The scripted server and the OpenAI client on it are test_providers' fixtures, used here by name.
from tests.test_providers import DEADLINE_SLACK_S, SECRET, SHORT, openai, server  # noqa: F401

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
PACE_S = 0.05  # seconds between a test stream's parts, so a client reads them one by one


@pytest.fixture
def anthropic(server):
    return AnthropicProvider(server.url, "claude-test", None)


class Pieces:
    """An on_text listener that records what it was given, and from which thread."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.threads: set[int] = set()

    def __call__(self, text: str) -> None:
        self.texts.append(text)
        self.threads.add(threading.get_ident())

    @property
    def joined(self) -> str:
        return "".join(self.texts)


def error_of(provider, timeout=SHORT, **kwargs) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        provider.complete(MESSAGES, [], timeout, **kwargs)
    return info.value


# --- OpenAI -------------------------------------------------------------------------------------


def test_an_openai_stream_hands_on_its_text_as_it_arrives_and_completes_with_usage(server, openai):
    server.add(stream([*text_chunks("Four", " is", " the answer."), usage_chunk(12, 5), DONE], PACE_S))
    pieces = Pieces()

    completion = openai.complete(MESSAGES, [], SHORT, on_text=pieces)

    assert completion == Completion("Four is the answer.", [], Usage(input_tokens=12, output_tokens=5))
    assert pieces.texts == ["Four", " is", " the answer."]  # one read each: the parts were paced
    assert pieces.threads == {threading.get_ident()}
    [request] = server.requests
    assert request.json["stream"] is True and request.json["stream_options"] == {"include_usage": True}
    assert "text/event-stream" in request.headers["accept"]


def test_tool_call_arguments_split_mid_token_and_two_calls_interleaved_are_assembled_by_index(server, openai):
    server.add(stream([
        chunk({"role": "assistant", "content": None}),
        call_delta(0, call_id="call_a", name="calculator", arguments='{"expr'),
        call_delta(1, call_id="call_b", name="current_time", arguments=""),
        call_delta(0, arguments='ession": "17'),
        call_delta(1, arguments='{"timezone": "Asia/To'),
        call_delta(0, arguments='*23"}'),
        call_delta(1, arguments='kyo"}'),
        chunk(finish_reason="tool_calls"),
        DONE,
    ], PACE_S))
    pieces = Pieces()

    completion = openai.complete(MESSAGES, [], SHORT, on_text=pieces)

    assert completion.tool_calls == [ToolCall("call_a", "calculator", '{"expression": "17*23"}'),
                                     ToolCall("call_b", "current_time", '{"timezone": "Asia/Tokyo"}')]
    assert completion.content is None
    assert pieces.texts == []  # tool-call deltas are not text


def test_an_openai_stream_that_ends_without_done_is_a_cut_off_not_an_answer(server, openai):
    server.add(stream(text_chunks("The answer is", " 4")))  # the body ends cleanly, but without [DONE]
    error = error_of(openai)
    assert error.kind == "connection" and "cut off" in error.message
    assert RETRY_POLICY.retryable(error)


def test_a_stream_that_stalls_after_three_words_is_cut_at_the_call_timeout(server, openai):
    server.add(stream([chunk({"content": "One"}), chunk({"content": " two"}), chunk({"content": " three"})],
                      PACE_S, stall=True))
    pieces = Pieces()
    timeout = CallTimeout(total_s=1.5, connect_s=1.0)
    started = time.monotonic()

    error = error_of(openai, timeout, on_text=pieces)

    assert error.kind == "timeout"
    assert 1.5 <= time.monotonic() - started < 1.5 + DEADLINE_SLACK_S
    assert pieces.joined == "One two three"  # what arrived was handed on before the cut


def test_a_stream_that_trickles_is_cut_at_the_call_timeout_too(server, openai):
    events = b"".join(text_chunks(*["word "] * 50)) + DONE
    server.add(stream([events[i:i + 1] for i in range(len(events))], 0.01))
    started = time.monotonic()
    error = error_of(openai, CallTimeout(total_s=1.0, connect_s=1.0))
    assert error.kind == "timeout"
    assert time.monotonic() - started < 1.0 + DEADLINE_SLACK_S


@pytest.mark.parametrize(("error", "kind", "status"), [
    ({"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}, "rate_limited", 429),
    ({"message": "The server had an error", "type": "server_error", "code": None}, "server", 500),
    ({"message": "Something odd", "type": "mystery"}, "server", 500),
    ({"message": "Bad input", "type": "invalid_request_error"}, "bad_request", 400),
])
def test_an_openai_error_mid_stream_is_the_error_its_type_names(server, openai, error, kind, status):
    server.add(stream([chunk({"content": "Partial"}), sse({"error": error})]))
    raised = error_of(openai)
    assert (raised.kind, raised.status) == (kind, status)
    assert error["message"] in raised.message


def test_two_megabytes_of_text_arrive_whole(server, openai):
    line = "".join(chr(ord("a") + i % 26) for i in range(1000))
    server.add(stream([*text_chunks(*[line] * 2000), DONE]))
    pieces = Pieces()
    completion = openai.complete(MESSAGES, [], CallTimeout(total_s=30.0, connect_s=2.0), on_text=pieces)
    assert completion.content == line * 2000
    assert pieces.joined == completion.content


def test_a_hundred_thousand_tiny_chunks_are_handed_on_in_batches(server, openai):
    # The smallest chunks a server may send (no id or object), so that 100,000 fit the 8 MiB bound.
    tiny = [b'data: {"choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % (i % 10) for i in range(100_000)]
    events = [*tiny, DONE]
    # A thousand events a write: many events a network read, as a fast server sends them.
    server.add(stream([b"".join(events[i:i + 1000]) for i in range(0, len(events), 1000)]))
    pieces = Pieces()

    completion = openai.complete(MESSAGES, [], CallTimeout(total_s=60.0, connect_s=2.0), on_text=pieces)

    assert completion.content == "".join(str(i % 10) for i in range(100_000))
    assert pieces.joined == completion.content
    assert len(pieces.texts) < 10_000  # at most one call a network read, never one an event


def test_a_character_split_across_network_reads_arrives_whole(server, openai):
    body = b"".join(text_chunks("caf\u00e9 \U0001f600 \u65e5\u672c")) + DONE
    # Cut inside the two-byte é, the four-byte emoji and the three-byte 日.
    cuts = [body.index("é".encode()) + 1, body.index("😀".encode()) + 2, body.index("日".encode()) + 1]
    parts = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    server.add(stream(parts, 0.2))
    pieces = Pieces()

    completion = openai.complete(MESSAGES, [], SHORT, on_text=pieces)

    assert completion.content == "café 😀 日本"
    assert pieces.joined == completion.content
    assert all("\ufffd" not in text for text in pieces.texts)


def test_a_server_that_refuses_to_stream_gets_a_plain_call_from_the_same_budget(server, openai):
    refusal = {"error": {"message": "stream is not supported by this server", "type": "invalid_request_error"}}
    server.add(reply(400, refusal), chat_reply("plain answer"), chat_reply("again"))
    pieces = Pieces()

    assert openai.complete(MESSAGES, [], SHORT, on_text=pieces) == Completion("plain answer")

    first, second = server.requests
    assert first.json["stream"] is True and "stream" not in second.json
    assert pieces.texts == ["plain answer"]  # the listener still sees the whole answer
    openai.complete(MESSAGES, [], SHORT)
    assert "stream" not in server.requests[2].json  # this client no longer asks


def test_a_refusal_with_no_time_left_for_a_plain_call_is_the_answer(server, openai):
    refusal = {"error": {"message": "'stream' is not supported", "type": "invalid_request_error"}}
    server.add(delayed(1.0, reply(400, refusal)))
    error = error_of(openai, CallTimeout(total_s=1.2, connect_s=1.0))
    assert (error.kind, error.status) == ("bad_request", 400)
    assert len(server.requests) == 1


def test_a_plain_json_answer_to_a_streaming_request_is_read_as_one(server, openai):
    server.add(chat_reply("whole", usage={"prompt_tokens": 3, "completion_tokens": 1}))
    pieces = Pieces()
    assert openai.complete(MESSAGES, [], SHORT, on_text=pieces) == Completion("whole", [], Usage(3, 1))
    assert pieces.texts == ["whole"] and len(server.requests) == 1


def test_an_error_status_to_a_streaming_request_is_mapped_as_before(server, openai):
    server.add(reply(429, {"error": {"message": "slow down"}}, {"Retry-After": "2"}))
    error = error_of(openai)
    assert (error.kind, error.retry_after_s) == ("rate_limited", 2.0)


def test_stop_mid_stream_ends_the_call_promptly(server, openai):
    server.add(stream([chunk({"content": "Once"}), chunk({"content": " upon"})], PACE_S, stall=True))
    stop = threading.Event()
    stopped_at: list[float] = []

    def on_text(text: str) -> None:
        if "upon" in text:
            stopped_at.append(time.monotonic())
            threading.Timer(0.2, stop.set).start()  # from another thread, as the page's Stop does

    error = error_of(openai, CallTimeout(total_s=30.0, connect_s=2.0), stop=stop, on_text=on_text)
    assert error.kind == "stopped"
    assert time.monotonic() - stopped_at[0] < 0.2 + DEADLINE_SLACK_S


def test_a_stream_larger_than_the_limit_is_refused(server, openai):
    piece = "x" * 100_000
    count = MAX_RESPONSE_BYTES // len(piece) + 10
    server.add(stream([*text_chunks(*[piece] * count), DONE]))
    error = error_of(openai, CallTimeout(total_s=60.0, connect_s=2.0))
    assert error.kind == "malformed" and "MiB" in error.message


def test_a_stream_that_is_not_utf8_is_malformed(server, openai):
    server.add(stream([b'data: {"choices": [{"index": 0, "delta": {"content": "\xff\xfe"}}]}\n\n', DONE]))
    assert error_of(openai).kind == "malformed"


MALFORMED_OPENAI_CHUNKS = [
    "not json",
    "[1, 2]",
    '{"choices": "nope"}',
    '{"choices": [7]}',
    '{"choices": [{"index": 0, "delta": 5}]}',
    '{"choices": [{"index": 0, "delta": {"content": 5}}]}',
    '{"choices": [{"index": 0, "delta": {"role": "user", "content": "x"}}]}',
    '{"choices": [{"index": 0, "delta": {"tool_calls": {"index": 0}}}]}',
    '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}',
    '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": 5}]}}]}',
    '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "type": "code"}]}}]}',
    '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": 3}}]}}]}',
    '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}',
]


@pytest.mark.parametrize("data", MALFORMED_OPENAI_CHUNKS)
def test_a_malformed_openai_chunk_is_a_malformed_error(server, openai, data):
    server.add(stream([sse(data), DONE]))
    error = error_of(openai)
    assert error.kind == "malformed", error.message


# --- Anthropic ----------------------------------------------------------------------------------


def test_an_anthropic_stream_hands_on_text_and_assembles_its_tool_use(server, anthropic):
    server.add(stream([
        message_start(input_tokens=25),
        PING,
        *text_block(0, "Let me", " compute that."),
        block_start(1, {"type": "thinking", "thinking": ""}),
        block_delta(1, {"type": "thinking_delta", "thinking": "hmm"}),
        block_stop(1),
        *tool_block(2, "toolu_1", "calculator", '{"expre', 'ssion": "2', '+2"}'),
        sse({"type": "something_new"}, "something_new"),  # a later API's event: skipped
        *message_end(output_tokens=31, stop_reason="tool_use"),
    ], PACE_S))
    pieces = Pieces()

    completion = anthropic.complete(MESSAGES, [], SHORT, on_text=pieces)

    call = ToolCall("toolu_1", "calculator", '{"expression": "2+2"}')
    assert completion == Completion("Let me compute that.", [call], Usage(input_tokens=25, output_tokens=31))
    assert pieces.texts == ["Let me", " compute that."]
    assert server.requests[0].json["stream"] is True


def test_an_anthropic_stream_without_message_stop_is_a_cut_off(server, anthropic):
    server.add(stream([message_start(), *text_block(0, "Half an ans")]))
    error = error_of(anthropic)
    assert error.kind == "connection" and "message_stop" in error.message


@pytest.mark.parametrize(("error_type", "kind", "status"), [
    ("overloaded_error", "server", 529),
    ("rate_limit_error", "rate_limited", 429),
    ("api_error", "server", 500),
    ("invalid_request_error", "bad_request", 400),
])
def test_an_anthropic_error_event_mid_stream_is_mapped_like_its_http_error(server, anthropic, error_type, kind,
                                                                          status):
    error_event = sse({"type": "error", "error": {"type": error_type, "message": "Overloaded"}}, "error")
    server.add(stream([message_start(), *text_block(0, "Par"), error_event]))
    error = error_of(anthropic)
    assert (error.kind, error.status) == (kind, status)
    assert RETRY_POLICY.retryable(error) == (status >= 429)


def test_an_anthropic_server_that_refuses_to_stream_gets_a_plain_call(server, anthropic):
    plain = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "plain"}],
             "usage": {"input_tokens": 4, "output_tokens": 2}}
    server.add(reply(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                      "message": "stream: Extra inputs are not permitted"}}),
               reply(200, plain))
    assert anthropic.complete(MESSAGES, [], SHORT) == Completion("plain", [], Usage(4, 2))
    assert "stream" not in server.requests[1].json


MALFORMED_ANTHROPIC_EVENTS = [
    [sse("not json", "message_start")],
    [sse({"type": "message_start", "message": {"type": "message", "role": "user"}}, "message_start")],
    [message_start(), block_start(0, {"type": "image"})],
    [message_start(), block_start(0, {"type": "text", "text": 5})],
    [message_start(), block_start(0, {"type": "tool_use", "id": "t", "input": {}})],
    [message_start(), block_delta(0, {"type": "text_delta", "text": "orphan"})],
    [message_start(), block_start(0, {"type": "text", "text": ""}), block_delta(0, {"type": "input_json_delta",
                                                                                  "partial_json": "{"})],
    [message_start(), *tool_block(0, "t", "f", '{"a": '), *message_end()[:0]],
    [message_start(), *tool_block(0, "t", "f", "[1, 2]")],
    [message_start(), block_start(0, {"type": "text", "text": ""}), block_start(0, {"type": "text", "text": ""})],
    [sse({"type": "message_stop"}, "message_stop")],
]


@pytest.mark.parametrize("events", MALFORMED_ANTHROPIC_EVENTS)
def test_a_malformed_anthropic_stream_is_a_malformed_error(server, anthropic, events):
    server.add(stream([*events, *message_end()]))
    error = error_of(anthropic)
    assert error.kind == "malformed", error.message


# --- the key, wherever a server splits it -------------------------------------------------------


def test_the_key_is_redacted_from_streamed_text_and_arguments_however_the_server_splits_them(server):
    # A server that echoes the key, in pieces cut at random places, some in another case: neither
    # the text handed on nor the completion may carry it (seeded, so a failure can be replayed).
    rng = random.Random(20261202)
    provider = OpenAIProvider(server.url + "/v1", "m", SECRET)
    for _ in range(25):
        key = "".join(c.upper() if rng.random() < 0.2 else c for c in SECRET)
        text = f"Your key is {key}, and again:{key}{key[:7]}"
        arguments = json.dumps({"echo": key})
        cuts = sorted(rng.sample(range(1, len(text)), 6))
        text_pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        arg_cut = rng.randrange(1, len(arguments))
        server.add(stream([
            *text_chunks(*text_pieces)[:-1],
            call_delta(0, call_id="call_1", name="calculator", arguments=arguments[:arg_cut]),
            call_delta(0, arguments=arguments[arg_cut:]),
            chunk(finish_reason="tool_calls"),
            DONE,
        ], 0.005))
        pieces = Pieces()

        completion = provider.complete(MESSAGES, [], SHORT, on_text=pieces)

        assert pieces.joined == completion.content
        for seen in (pieces.joined, completion.content, completion.tool_calls[0].arguments):
            assert SECRET.lower() not in seen.lower()
        assert completion.content.count("[redacted]") == 2
        assert completion.content.endswith(key[:7])  # the start of a key, never completed, is handed on at the end


# --- the event-stream parser, as pure logic -----------------------------------------------------


def test_the_event_stream_parser_gives_the_same_events_however_the_bytes_are_cut():
    body = ("\ufeffevent: a\r\ndata: h\u00e9llo \U0001f600\r\ndata:x\r\n\r\n: keep-alive\n\n"
            "data: {\"a\": 1}\r\rid: 7\nretry: 10\ndata: last\n\nevent: empty\n\n").encode()
    expected = [Event("a", "héllo 😀\nx"), Event("message", '{"a": 1}'), Event("message", "last")]
    assert EventStreamParser().feed(body) == expected
    rng = random.Random(7)
    for _ in range(500):
        parser, events, start = EventStreamParser(), [], 0
        while start < len(body):
            size = rng.randint(1, 6)
            events += parser.feed(body[start:start + size])
            start += size
        parser.close()
        assert events == expected


def test_a_character_left_unfinished_at_the_end_of_the_stream_is_malformed():
    parser = EventStreamParser()
    parser.feed(b"data: caf" + "é".encode()[:1])
    with pytest.raises(ProviderError) as info:
        parser.close()
    assert info.value.kind == "malformed"


def test_the_text_relay_holds_back_only_what_could_start_the_key():
    pieces = Pieces()
    relay = TextRelay(pieces, "sk-abc")
    relay.add("hello s")
    relay.flush()
    relay.add("k-ab")
    relay.flush()
    assert pieces.joined == "hello "  # "sk-ab" could still become the key
    relay.add("c!")
    relay.flush()
    assert relay.finish() == "hello [redacted]!" == pieces.joined


def test_an_exception_from_the_listener_ends_the_call_and_the_next_call_starts_clean(server, openai):
    server.add(stream([*text_chunks("one", " two"), DONE], PACE_S), chat_reply("next"))

    def failing(text: str) -> None:
        raise RuntimeError("the listener failed")

    with pytest.raises(RuntimeError, match="the listener failed"):
        openai.complete(MESSAGES, [], SHORT, on_text=failing)
    assert openai.complete(MESSAGES, [], SHORT) == Completion("next")


@pytest.mark.parametrize("streamed", [True, False])
def test_a_key_written_with_json_escapes_in_tool_arguments_is_redacted_as_the_parser_reads_it(server, streamed):
    # `\u0073k-…` is the key to whoever parses the arguments (the page, the tool): it must not be stored.
    escaped = "".join(f"\\u{ord(c):04x}" if i % 3 == 0 else c for i, c in enumerate(SECRET))
    arguments = '{"echo": "' + escaped + '", "again": "\\u0073' + SECRET[1:] + '"}'
    provider = OpenAIProvider(server.url + "/v1", "m", SECRET)
    if streamed:
        server.add(stream([call_delta(0, call_id="call_1", name="calculator", arguments=arguments[:17]),
                           call_delta(0, arguments=arguments[17:]), chunk(finish_reason="tool_calls"), DONE]))
    else:
        server.add(reply(200, {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "calculator", "arguments": arguments}}]}}]}))

    completion = provider.complete(MESSAGES, [], SHORT, stream=streamed)

    parsed = json.loads(completion.tool_calls[0].arguments)
    assert parsed == {"echo": "[redacted]", "again": "[redacted]"}
