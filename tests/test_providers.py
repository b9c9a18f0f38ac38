"""Provider clients against real HTTP servers on loopback: timeouts, errors, validation, mapping, secrets."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import pytest
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty

from agent import job_alarm
from agent.deadline import CallTimeout
from agent.providers import AnthropicProvider, OpenAIProvider, ProviderError, make_provider, registry
from agent.providers import http as provider_http
from agent.providers.anthropic import parse_message, to_anthropic_messages, to_anthropic_tools
from agent.providers.base import Completion, ToolCall
from agent.providers.http import HTTPReply, check_status, parse_retry_after
from agent.providers.openai import parse_completion
from agent.providers.retry import RETRY_POLICY
from agent.providers.spec import ProviderSpec
from agent.runtime.loopback_server import delayed, hang, raw, reply, reset, trickle
from agent.secrets import read_secret
from agent.settings import Settings, SettingsError, TurnConfig
from tests.conftest import FAST
from tests.scripted_server import ScriptedServer, chat_reply, respond, tool_call
from tests.test_turn_unit import make_turn

SHORT = CallTimeout(total_s=5.0, connect_s=2.0)
DEADLINE_SLACK_S = 1.5  # seconds past a call's total timeout a busy machine may take to end it
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Safe arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
SECRET = "sk-test-SECRET-value-1234567890"


@pytest.fixture
def server():
    scripted = ScriptedServer()
    try:
        yield scripted
    finally:
        scripted.stop()


@pytest.fixture
def openai(server):
    return OpenAIProvider(server.url + "/v1", "test-model", None)


def error_of(provider, timeout=SHORT) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        provider.complete(MESSAGES, [], timeout)
    return info.value


@contextmanager
def alarm_raising(exc: BaseException, after_s: float):
    """Raise `exc` from a SIGALRM handler, as RQ's job timeout does in the work horse."""

    def handler(signum, frame):
        raise exc

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, after_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- OpenAI: the happy path ---------------------------------------------------------------


def test_openai_completion_parses_a_tool_call_and_sends_the_request_as_chat_completions(server, openai):
    server.add(chat_reply(None, [tool_call("calculator", {"expression": "2+2"}, "call_7")]))

    completion = openai.complete(MESSAGES, [CALCULATOR], SHORT)

    assert completion == Completion(None, [ToolCall("call_7", "calculator", '{"expression": "2+2"}')])
    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.json == {"model": "test-model", "messages": MESSAGES, "tools": [CALCULATOR], "tool_choice": "auto",
                            "stream": True, "stream_options": {"include_usage": True}}


def test_tools_and_tool_choice_are_omitted_when_there_are_none(server, openai):
    server.add(chat_reply("4"))
    assert openai.complete(MESSAGES, [], SHORT) == Completion("4")
    assert "tools" not in server.requests[0].json and "tool_choice" not in server.requests[0].json


def only_with_an_explicit_tool_choice(offer_call, answer_text):
    """As llama-cpp-python's server does: the tools reach the prompt only when `tool_choice` is given."""

    def decide(request):
        chosen = request.json.get("tool_choice") not in (None, "none") and request.json.get("tools")
        return offer_call() if chosen else answer_text()

    return respond(decide)


def test_tools_reach_a_server_that_honours_only_an_explicit_tool_choice(server, openai):
    server.add(only_with_an_explicit_tool_choice(
        lambda: chat_reply(None, [tool_call("calculator", {"expression": "2+2"})]),
        lambda: chat_reply("I have no tools.")))
    completion = openai.complete(MESSAGES, [CALCULATOR], SHORT)
    assert [call.name for call in completion.tool_calls] == ["calculator"]


def test_a_turn_calls_its_tools_on_a_server_that_honours_only_an_explicit_tool_choice(store, server):
    def answer_the_result():
        return chat_reply(f"It is {server.requests[-1].json['messages'][-1]['content']}.")

    def call_or_answer():
        last = server.requests[-1].json["messages"][-1]
        return answer_the_result() if last["role"] == "tool" else chat_reply(
            None, [tool_call("calculator", {"expression": "17*23"})])

    server.add(*[only_with_an_explicit_tool_choice(call_or_answer, lambda: chat_reply("I have no tools."))] * 2)
    turn = make_turn(store, FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1"))
    assert turn.run() == "done"
    state = store.read(turn.context.writer.conversation_id)
    assert state["history"][-1]["content"] == "It is 391."
    assert [request.json["tool_choice"] for request in server.requests] == ["auto", "auto"]


def test_tools_reach_an_anthropic_server_that_honours_only_an_explicit_tool_choice(server):
    server.add(only_with_an_explicit_tool_choice(lambda: reply(200, ANTHROPIC_REPLY),
                                                 lambda: reply(200, ANTHROPIC_TEXT_REPLY)))
    completion = AnthropicProvider(server.url, "claude-test", None).complete(MESSAGES, [CALCULATOR], SHORT)
    assert [call.name for call in completion.tool_calls] == ["calculator"]
    assert server.requests[0].json["tool_choice"] == {"type": "auto"}


def test_an_anthropic_call_without_tools_sends_no_tool_choice(server):
    server.add(reply(200, ANTHROPIC_TEXT_REPLY))
    assert AnthropicProvider(server.url, "claude-test", None).complete(MESSAGES, [], SHORT) == Completion("Four.")
    assert "tools" not in server.requests[0].json and "tool_choice" not in server.requests[0].json


def test_authorization_header_is_sent_only_when_a_key_is_given(server):
    server.add(chat_reply("a"), chat_reply("b"))
    OpenAIProvider(server.url, "m", SECRET).complete(MESSAGES, [], SHORT)
    OpenAIProvider(server.url, "m", None).complete(MESSAGES, [], SHORT)
    with_key, without_key = server.requests
    assert with_key.headers["authorization"] == f"Bearer {SECRET}"
    assert "authorization" not in without_key.headers


def test_successive_calls_reuse_one_connection(server, openai):
    server.add(chat_reply("a"), chat_reply("b"))
    openai.complete(MESSAGES, [], SHORT)
    openai.complete(MESSAGES, [], SHORT)
    first, second = server.requests
    assert first.client_port == second.client_port


def test_a_message_with_neither_content_nor_tool_calls_has_empty_content():
    data = {"choices": [{"message": {"role": "assistant", "content": None}}]}
    assert parse_completion(data) == Completion("")


def test_arguments_that_are_invalid_json_are_left_for_the_tool_layer():
    data = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [tool_call("f", "{oops")]}}]}
    assert parse_completion(data).tool_calls == [ToolCall("call_1", "f", "{oops")]


# --- timeouts and transport failures --------------------------------------------------------


def test_a_hanging_server_times_out_within_the_total_timeout(server, openai):
    server.add(hang())
    started = time.monotonic()
    error = error_of(openai, CallTimeout(total_s=1.0, connect_s=1.0))
    elapsed = time.monotonic() - started
    assert error.kind == "timeout"
    assert RETRY_POLICY.retryable(error)
    assert "did not answer within 1.0 s" in error.message
    assert elapsed < 1.0 + DEADLINE_SLACK_S


def test_a_trickling_server_cannot_keep_a_call_alive_past_its_total_timeout(server, openai):
    # One byte every 0.3 s never trips a per-read timeout (httpx#1450); only a total bound stops it.
    server.add(trickle(json.dumps({"choices": []}).ljust(200), bytes_per_second=1 / 0.3))
    started = time.monotonic()
    error = error_of(openai, CallTimeout(total_s=1.5, connect_s=1.0))
    elapsed = time.monotonic() - started
    assert error.kind == "timeout"
    assert 1.2 <= elapsed <= 1.5 + DEADLINE_SLACK_S  # a per-read timeout would let it run for a minute


def test_a_refused_connection_is_a_connection_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = error_of(OpenAIProvider(f"http://127.0.0.1:{port}", "m", None))
    assert error.kind == "connection"
    assert RETRY_POLICY.retryable(error)


def test_a_connection_reset_mid_body_is_a_connection_error(server, openai):
    server.add(reset(json.dumps({"choices": [{"message": {"role": "assistant", "content": "x" * 500}}]})))
    assert error_of(openai).kind == "connection"


def test_a_reply_that_is_not_http_is_a_connection_error(server, openai):
    server.add(raw(b"this is not HTTP at all\r\n\r\n"))
    assert error_of(openai).kind == "connection"


def test_a_reply_larger_than_the_limit_is_malformed(server, openai, monkeypatch):
    monkeypatch.setattr(provider_http, "MAX_RESPONSE_BYTES", 1000)
    server.add(chat_reply("x" * 2000))
    error = error_of(openai)
    assert error.kind == "malformed"


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), JobTimeoutException("job timed out")])
def test_an_interruption_mid_call_propagates_and_the_next_call_starts_clean(server, openai, interruption):
    server.add(hang(), chat_reply("after"))
    loop_before = provider_http._session().loop

    with pytest.raises(type(interruption)), alarm_raising(interruption, 0.3):
        openai.complete(MESSAGES, [], CallTimeout(total_s=5.0, connect_s=1.0))

    assert loop_before.is_closed()
    assert openai.complete(MESSAGES, [], SHORT) == Completion("after")
    assert provider_http._session().loop is not loop_before


JOB_ALARM_ACTIONS = {
    "hang": hang,
    "trickle": lambda: trickle(json.dumps({"choices": []}).ljust(400), bytes_per_second=20),
    "slow reply": lambda: delayed(2.0, chat_reply("late")),
}


# Fired "anywhere", the alarm may land in a garbage-collection callback, where Python itself
# reports and drops it ("Exception ignored"): the recorded alarm still ends the call.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("after_s", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("where", ["inside a loop callback", "anywhere"])
@pytest.mark.parametrize("action", sorted(JOB_ALARM_ACTIONS))
def test_the_job_timeout_ends_a_call_wherever_in_the_event_loop_it_fires(server, openai, action, where, after_s):
    # RQ raises its job timeout from a SIGALRM handler. Fired while asyncio runs a callback, the
    # loop catches it and logs "Exception in callback", and the call went on to its own end.
    server.add(JOB_ALARM_ACTIONS[action]())
    loop = provider_http._session().loop
    main_thread = threading.get_ident()
    started = time.monotonic()
    with UnixSignalDeathPenalty(60, JobTimeoutException), job_alarm.watching():  # RQ's own alarm and handler
        if where == "anywhere":
            signal.setitimer(signal.ITIMER_REAL, after_s + 0.01)
        else:
            loop.call_later(after_s, signal.pthread_kill, main_thread, signal.SIGALRM)
        with pytest.raises(JobTimeoutException):
            openai.complete(MESSAGES, [], CallTimeout(total_s=10.0, connect_s=5.0))
    assert time.monotonic() - started < 6  # at the alarm, not at the call's own end (2 s to 10 s)


def test_closing_a_session_whose_task_will_not_end_is_bounded():
    # A job timeout that fires inside one of the loop's own timers drops that callback (asyncio logs it),
    # and a task that swallows its cancellation never lets a bounded wait end: the close of a discarded
    # session once waited for ever there, holding its worker. A watchdog now stops the loop.
    session = provider_http._Session()

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    session.loop.run_until_complete(asyncio.sleep(0, session.loop.create_task(stubborn())))
    closing = threading.Thread(target=session.close, daemon=True)
    started = time.monotonic()
    closing.start()
    closing.join(provider_http.CLEANUP_BOUND_S + 5)
    assert not closing.is_alive(), "the close of a discarded session never returned"
    assert time.monotonic() - started < provider_http.CLEANUP_BOUND_S + 1
    assert session.loop.is_closed()


# --- statuses -------------------------------------------------------------------------------


def test_401_is_an_auth_error_that_is_not_retried_and_does_not_echo_the_key(server):
    server.add(reply(401, {"error": {"message": f"Incorrect API key provided: {SECRET}"}}))
    error = error_of(OpenAIProvider(server.url, "m", SECRET))
    assert (error.kind, error.status, RETRY_POLICY.retryable(error)) == ("auth", 401, False)
    assert error.message == "the API key was rejected (HTTP 401)"
    assert SECRET not in str(error)


def test_a_transport_error_that_quotes_the_url_has_the_key_redacted():
    # httpx quotes an unusable URL; a base URL that carries the key must not carry it into the error.
    error = error_of(OpenAIProvider(f"http://[{SECRET.upper()}]/v1", "m", SECRET))
    assert error.kind == "connection" and "[redacted]" in error.message
    assert SECRET.lower() not in error.message.lower()


def test_401_without_a_key_says_a_key_is_required(server, openai):
    server.add(reply(401, {"error": "unauthorized"}))
    error = error_of(openai)
    assert error.kind == "auth"
    assert "requires an API key" in error.message


def test_429_carries_retry_after_and_is_retryable(server, openai):
    server.add(reply(429, {"error": {"message": "slow down"}}, {"Retry-After": "2"}))
    error = error_of(openai)
    assert (error.kind, error.retry_after_s, RETRY_POLICY.retryable(error)) == ("rate_limited", 2.0, True)


def test_529_is_a_retryable_overloaded_server_error(server, openai):
    server.add(reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    error = error_of(openai)
    assert (error.kind, RETRY_POLICY.retryable(error)) == ("server", True)
    assert "overloaded" in error.message


def test_400_quotes_the_providers_message_truncated_and_is_not_retried(server, openai):
    server.add(reply(400, {"error": {"message": "bad tool schema " + "x" * 1000}}))
    error = error_of(openai)
    assert (error.kind, RETRY_POLICY.retryable(error)) == ("bad_request", False)
    assert "bad tool schema" in error.message
    assert len(error.message) < 400


def test_404_is_not_found(server, openai):
    server.add(reply(404, {"error": "model 'nope' not found"}))
    error = error_of(openai)
    assert (error.kind, RETRY_POLICY.retryable(error)) == ("not_found", False)
    assert "model 'nope' not found" in error.message


@pytest.mark.parametrize("status", [408, 409, 500, 502, 503])
def test_transient_statuses_are_retryable_server_errors(status):
    error = pytest.raises(ProviderError, check_status, HTTPReply(status, {}, b"<html>oops</html>")).value
    assert (error.kind, RETRY_POLICY.retryable(error)) == ("server", True)


def test_retry_after_accepts_milliseconds_and_http_dates():
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "Thu, 01 Jan 1970 00:00:10 GMT"}, now=4.0) == 6.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "-3"}) is None
    assert parse_retry_after({}) is None


# --- malformed responses --------------------------------------------------------------------

MALFORMED_BODIES = {
    "not json": b"{not json",
    "deeply nested": b"[" * 100_000,
    "a list": b"[1, 2]",
    "choices missing": b'{"id": "x"}',
    "choices empty": b'{"choices": []}',
    "choice not an object": b'{"choices": [3]}',
    "message missing": b'{"choices": [{}]}',
    "role wrong": b'{"choices": [{"message": {"role": "user", "content": "hi"}}]}',
    "content a number": b'{"choices": [{"message": {"role": "assistant", "content": 4}}]}',
    "tool_calls not a list": b'{"choices": [{"message": {"role": "assistant", "tool_calls": {"id": "a"}}}]}',
    "tool call not an object": b'{"choices": [{"message": {"role": "assistant", "tool_calls": ["f"]}}]}',
    "arguments not a string": json.dumps(
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}],
                    }
                }
            ]
        }
    ).encode(),
    "function missing": b'{"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": "c", '
    b'"type": "function"}]}}]}',
    "not utf-8": b'{"choices": "\xff\xfe"}',
}


@pytest.mark.parametrize("body", MALFORMED_BODIES.values(), ids=MALFORMED_BODIES.keys())
def test_a_malformed_response_is_a_malformed_error_and_nothing_else(server, openai, body):
    server.add(reply(200, body=body))
    error = error_of(openai)
    assert error.kind == "malformed"
    assert error.message.startswith("the provider sent a malformed response: ")
    assert not RETRY_POLICY.retryable(error)


# --- Anthropic ------------------------------------------------------------------------------

HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Add 2 and 2, then tell the time."},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            tool_call("calculator", {"expression": "2+2"}, "call_1"),
            tool_call("current_time", "{not json", "call.2"),
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    {"role": "tool", "tool_call_id": "call.2", "content": "Error: unknown timezone"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "Thanks."},
    {"role": "user", "content": "Again?"},
]


def test_openai_history_maps_to_alternating_anthropic_messages_with_tool_blocks():
    system, messages = to_anthropic_messages(HISTORY)

    assert system == "Be brief."
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "calculator", "input": {"expression": "2+2"}},
        {"type": "tool_use", "id": "call_2", "name": "current_time", "input": {}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "4"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "Error: unknown timezone", "is_error": True},
    ]
    assert messages[4]["content"] == [{"type": "text", "text": "Thanks."}, {"type": "text", "text": "Again?"}]


def test_tool_calls_left_without_results_get_an_error_result_so_the_history_stays_sendable():
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("wait", {"seconds": 9}, "call_9")]},
        {"role": "user", "content": "are you there?"},
    ]
    _, messages = to_anthropic_messages(history)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    first, second = messages[2]["content"]
    assert (first["type"], first["tool_use_id"], first["is_error"]) == ("tool_result", "call_9", True)
    assert second == {"type": "text", "text": "are you there?"}


def test_openai_tool_schemas_map_to_anthropic_tools():
    assert to_anthropic_tools([CALCULATOR]) == [
        {
            "name": "calculator",
            "description": "Safe arithmetic.",
            "input_schema": CALCULATOR["function"]["parameters"],
        }
    ]


ANTHROPIC_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Computing."},
        {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "2+2"}},
    ],
    "stop_reason": "tool_use",
}
ANTHROPIC_TEXT_REPLY = {"id": "msg_2", "type": "message", "role": "assistant",
                        "content": [{"type": "text", "text": "Four."}], "stop_reason": "end_turn"}


def test_an_anthropic_response_with_tool_use_maps_back_to_a_completion():
    completion = parse_message(ANTHROPIC_REPLY)
    assert completion == Completion("Computing.", [ToolCall("toolu_1", "calculator", '{"expression": "2+2"}')])
    assert json.loads(completion.tool_calls[0].arguments) == {"expression": "2+2"}


def test_anthropic_calls_v1_messages_with_its_headers_system_and_tools(server):
    server.add(reply(200, ANTHROPIC_REPLY))
    provider = AnthropicProvider(server.url, "claude-test", SECRET, max_tokens=99)

    completion = provider.complete(HISTORY[:2], [CALCULATOR], SHORT)

    assert completion.tool_calls[0].name == "calculator"
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == SECRET
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.json["system"] == "Be brief."
    assert request.json["max_tokens"] == 99
    assert request.json["tools"][0]["input_schema"]["required"] == ["expression"]
    assert request.json["messages"] == [{"role": "user", "content": [{"type": "text", "text": HISTORY[1]["content"]}]}]


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"type": "error", "error": {"message": "x"}},
        {"type": "message", "content": "text"},
        {"type": "message", "content": [{"type": "text", "text": 5}]},
        {"type": "message", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]},
        {"type": "message", "content": [{"type": "image"}]},
        {"type": "message", "content": [7]},
    ],
)
def test_a_malformed_anthropic_response_is_a_malformed_error(data):
    with pytest.raises(ProviderError) as info:
        parse_message(data)
    assert info.value.kind == "malformed"


def test_anthropic_overloaded_is_retryable(server):
    server.add(reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    error = error_of(AnthropicProvider(server.url, "m", SECRET))
    assert (error.kind, error.status, RETRY_POLICY.retryable(error)) == ("server", 529, True)


# --- make_provider and secrets --------------------------------------------------------------


def test_make_provider_reads_the_key_from_the_environment(server, tmp_path):
    server.add(chat_reply("hi"))
    config = TurnConfig(provider="openai", model="gpt-test", base_url=server.url)
    provider = make_provider(config, env={"OPENAI_API_KEY": SECRET}, project_root=tmp_path)

    provider.complete(MESSAGES, [], SHORT)

    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(provider)
    assert SECRET not in json.dumps(config.to_dict())


def test_make_provider_falls_back_to_streamlit_secrets(server, tmp_path):
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "secrets.toml").write_text(f'ANTHROPIC_API_KEY = "{SECRET}"\n')
    server.add(reply(401, {"type": "error", "error": {"message": f"invalid x-api-key {SECRET}"}}))
    config = TurnConfig(provider="anthropic", model="claude-test")
    provider = make_provider(config, env={"ANTHROPIC_BASE_URL": server.url}, project_root=tmp_path)

    error = error_of(provider)

    assert server.requests[0].headers["x-api-key"] == SECRET
    assert error.kind == "auth"
    assert SECRET not in str(error) and SECRET not in repr(error) and SECRET not in repr(provider)


def test_the_environment_wins_over_secrets_and_a_broken_secrets_file_is_ignored(tmp_path):
    (tmp_path / ".streamlit").mkdir()
    secrets = tmp_path / ".streamlit" / "secrets.toml"
    secrets.write_text('OPENAI_API_KEY = "from-file"\n')
    assert read_secret("OPENAI_API_KEY", env={"OPENAI_API_KEY": "from-env"}, project_root=tmp_path) == "from-env"
    assert read_secret("OPENAI_API_KEY", env={}, project_root=tmp_path) == "from-file"
    secrets.write_text(f"OPENAI_API_KEY = {SECRET} not toml")
    assert read_secret("OPENAI_API_KEY", env={}, project_root=tmp_path) is None


def test_make_provider_uses_the_demo_url_and_refuses_when_the_demo_is_not_running(tmp_path):
    config = TurnConfig(provider="demo", model="demo")
    provider = make_provider(config, env={"AGENT_DEMO_URL": "http://127.0.0.1:9/v1"}, project_root=tmp_path)
    assert isinstance(provider, OpenAIProvider) and provider.base_url == "http://127.0.0.1:9/v1"
    forged = replace(config, base_url="http://evil.test/v1")  # a turn never names the demo's server
    assert make_provider(forged, env={"AGENT_DEMO_URL": "http://127.0.0.1:9/v1"}).base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ProviderError) as info:
        make_provider(config, env={}, project_root=tmp_path)
    assert (info.value.kind, info.value.message) == ("connection", "the demo provider is not running")


# A provider that is one declaration and one registration, as a new OpenAI-compatible one would be.
LOCALAI = ProviderSpec(name="localai", client=OpenAIProvider, default_model="tiny", url_variable="LOCALAI_BASE_URL",
                       default_url="https://models.example.test/v1", key_variable="LOCALAI_API_KEY")


@pytest.fixture
def localai(monkeypatch):
    monkeypatch.setattr(registry, "PROVIDERS", dict(registry.PROVIDERS))  # the registration ends with the test
    return registry.register(LOCALAI)


def test_a_registered_provider_is_validated_by_the_settings_and_built_by_the_factory(localai, server, tmp_path):
    for env, variable in [({"AGENT_PROVIDER": "localai"}, "LOCALAI_API_KEY"),
                          ({"AGENT_PROVIDER": "localai", "LOCALAI_API_KEY": "k", "LOCALAI_BASE_URL": "ftp://x"},
                           "LOCALAI_BASE_URL")]:
        with pytest.raises(SettingsError) as info:
            Settings.from_env(env)
        assert info.value.variable == variable
    with pytest.raises(SettingsError, match="must be one of demo, openai, anthropic, localai"):
        Settings.from_env({"AGENT_PROVIDER": "other"})
    on_loopback = Settings.from_env({"AGENT_PROVIDER": "localai", "LOCALAI_BASE_URL": server.url}).turn
    assert (on_loopback.provider, on_loopback.model, on_loopback.base_url) == ("localai", "tiny", server.url)
    remote = Settings.from_env({"AGENT_PROVIDER": "localai", "LOCALAI_API_KEY": SECRET}).turn
    assert remote.base_url == "https://models.example.test/v1" and SECRET not in json.dumps(remote.to_dict())

    server.add(chat_reply("hi from localai"))
    env = {"LOCALAI_API_KEY": SECRET, "LOCALAI_BASE_URL": server.url}
    provider = make_provider(on_loopback, env=env, project_root=tmp_path)
    assert provider.complete(MESSAGES, [], SHORT).content == "hi from localai"
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert server.requests[0].json["model"] == "tiny"
    with pytest.raises(ProviderError) as refused:
        make_provider(replace(on_loopback, base_url="https://evil.test/v1"), env=env, project_root=tmp_path)
    assert "LOCALAI_BASE_URL" in refused.value.message and "LOCALAI_API_KEY" in refused.value.message


def test_openai_base_url_comes_from_the_environment_when_the_config_has_none(tmp_path):
    config = TurnConfig(provider="openai", model="m", base_url=None)
    provider = make_provider(config, env={"OPENAI_BASE_URL": "http://localhost:11434/v1/"}, project_root=tmp_path)
    assert provider.base_url == "http://localhost:11434/v1"
    assert make_provider(config, env={}, project_root=tmp_path).base_url == "https://api.openai.com/v1"


def test_the_key_is_sent_only_to_the_base_url_the_worker_is_configured_for():
    from agent.settings import TurnConfig

    env = {"OPENAI_API_KEY": "sk-canary-base-url", "OPENAI_BASE_URL": "https://api.example.test/v1"}
    config = TurnConfig(provider="openai", model="m", base_url="https://attacker.example.test/v1")
    with pytest.raises(ProviderError) as info:
        make_provider(config, env=env)
    assert info.value.kind == "auth"
    assert "sk-canary-base-url" not in str(info.value)
    same = TurnConfig(provider="openai", model="m", base_url="https://api.example.test/v1/")
    assert make_provider(same, env=env) is not None


def test_a_key_with_control_characters_is_refused_without_quoting_it():
    from agent.settings import TurnConfig

    env = {"OPENAI_API_KEY": "sk-canary-newline\nabc"}
    with pytest.raises(ProviderError) as info:
        make_provider(TurnConfig(provider="openai", model="m"), env=env)
    assert "sk-canary" not in str(info.value)
