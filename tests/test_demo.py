"""The demo provider: the scripted model and its HTTP behaviour as pure logic, and its server over real HTTP."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from agent.deadline import CallTimeout
from agent.demo.model import respond
from agent.demo.scenarios import DEFAULT_LATENCY_S, DEFAULT_STREAM_CPS, Scenario, UnknownModelError, parse_model_name
from agent.demo.server import HANG_CAP_S, DemoProvider, DemoServer
from agent.demo.stream import MAX_WRITING_S
from agent.providers.demo import DEMO
from agent.providers.openai import OpenAIProvider
from agent.runtime.loopback_server import Delayed, Hang, LoopbackServer, Reply, Request, Stream, Trickle, reply

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("calculator", "current_time", "search_docs", "wait")
]
HEALTHY = Scenario()
SERIAL_100_CALLS_S = 100.0  # seconds that 100 one-second calls take one after another


def _call(message: dict) -> tuple[str, dict]:
    (call,) = message["tool_calls"]
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def _tool_result(history: list[dict], assistant: dict, content: str) -> None:
    history.append(assistant)
    history.append({"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": content})


def _chat(model: str, text: str = "What is 17*23?", tools: list[dict] | None = TOOLS) -> dict:
    body: dict = {"model": model, "messages": [{"role": "user", "content": text}]}
    if tools is not None:
        body["tools"] = tools
    return body


# --- the model ---


def test_arithmetic_question_calls_the_calculator_with_the_expression():
    message = respond([{"role": "user", "content": "What is 17*23?"}], TOOLS, HEALTHY)
    assert message["role"] == "assistant"
    assert _call(message) == ("calculator", {"expression": "17*23"})
    assert message["tool_calls"][0]["id"] == "call_1"


def test_caret_becomes_power_and_parenthesised_expressions_are_kept_whole():
    history = [{"role": "user", "content": "Compute (2+3)*4 and 2^10 please."}]
    first = respond(history, TOOLS, HEALTHY)
    assert _call(first) == ("calculator", {"expression": "(2+3)*4"})
    _tool_result(history, first, "20")
    assert _call(respond(history, TOOLS, HEALTHY)) == ("calculator", {"expression": "2**10"})


def test_two_tool_question_takes_one_call_per_round_trip_then_answers():
    history = [{"role": "user", "content": "What is 17*23, and what time is it in Tokyo?"}]
    first = respond(history, TOOLS, HEALTHY)
    assert _call(first) == ("calculator", {"expression": "17*23"})
    _tool_result(history, first, "391")

    second = respond(history, TOOLS, HEALTHY)
    assert _call(second) == ("current_time", {"timezone": "Asia/Tokyo"})
    assert second["tool_calls"][0]["id"] == "call_2"
    _tool_result(history, second, "2026-01-01T09:00:00+09:00")

    final = respond(history, TOOLS, HEALTHY)
    assert "tool_calls" not in final
    assert "391" in final["content"]
    assert "2026-01-01T09:00:00+09:00" in final["content"]


def test_time_question_maps_cities_and_defaults_to_utc():
    for text, zone in [
        ("time in New York", "America/New_York"),
        ("what time is it in San Francisco?", "America/Los_Angeles"),
        ("current time", "UTC"),
    ]:
        message = respond([{"role": "user", "content": text}], TOOLS, HEALTHY)
        assert _call(message) == ("current_time", {"timezone": zone})


def test_app_questions_search_the_docs_and_slow_waits():
    docs = respond([{"role": "user", "content": "How does the deadline work?"}], TOOLS, HEALTHY)
    assert _call(docs) == ("search_docs", {"query": "How does the deadline work?"})
    assert _call(respond([{"role": "user", "content": "slow 5"}], TOOLS, HEALTHY)) == ("wait", {"seconds": 5.0})
    assert _call(respond([{"role": "user", "content": "be slow"}], TOOLS, HEALTHY)) == ("wait", {"seconds": 3.0})


def test_tool_error_is_mentioned_in_the_answer():
    history = [{"role": "user", "content": "What is 1/0?"}]
    first = respond(history, TOOLS, HEALTHY)
    _tool_result(history, first, "Error: division by zero")
    assert "Error: division by zero" in respond(history, TOOLS, HEALTHY)["content"]


def test_request_without_tools_gets_a_text_answer_with_what_it_has():
    history = [{"role": "user", "content": "What is 17*23, and what time is it in Tokyo?"}]
    assert "tool_calls" not in respond(history, [], HEALTHY)
    first = respond(history, TOOLS, HEALTHY)
    _tool_result(history, first, "391")
    final = respond(history, [], HEALTHY)
    assert "tool_calls" not in final
    assert "391" in final["content"] and "current_time" in final["content"]


def test_only_offered_tools_are_called():
    message = respond([{"role": "user", "content": "What is 17*23 and the time in Tokyo?"}], TOOLS[1:2], HEALTHY)
    assert _call(message) == ("current_time", {"timezone": "Asia/Tokyo"})


def test_small_talk_gets_a_friendly_reply_naming_what_it_can_do():
    message = respond([{"role": "user", "content": "hello"}], TOOLS, HEALTHY)
    assert "tool_calls" not in message
    assert "arithmetic" in message["content"] and "slow" in message["content"]
    assert respond([{"role": "user", "content": "hello"}], TOOLS, HEALTHY) == message  # deterministic


def test_loop_scenario_never_answers():
    history = [{"role": "user", "content": "hello"}]
    for _ in range(20):
        message = respond(history, TOOLS, Scenario("loop"))
        assert _call(message) == ("calculator", {"expression": "1+1"})
        _tool_result(history, message, "2")


def test_slow_tool_scenario_waits_long_first_then_answers():
    history = [{"role": "user", "content": "What is 17*23?"}]
    first = respond(history, TOOLS, Scenario("slow-tool"))
    assert _call(first) == ("wait", {"seconds": 30.0})
    _tool_result(history, first, "waited 30 s")
    second = respond(history, TOOLS, Scenario("slow-tool"))
    assert _call(second)[0] == "calculator"


# --- notes: the tool that asks a person first ---

NOTE_TOOLS = [*TOOLS, {"type": "function", "function": {"name": "add_note", "parameters": {"type": "object"}}}]
DECLINED = "Error: not run: a person declined this tool call. Do not try it again; answer without it."
EXPIRED = ("Error: not run: nobody answered the request to approve this tool call within 10 minutes, so it expired. "
           "Nobody declined it. Answer without it, and say that it was not done.")


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def _answered(text: str, results: list[str]) -> str:
    """The final answer to a message whose one reply of calls got these results, in order."""
    history = [{"role": "user", "content": text}]
    reply = respond(history, NOTE_TOOLS, HEALTHY)
    history.append(reply)
    history += [{"role": "tool", "tool_call_id": c["id"], "content": r}
                for c, r in zip(reply["tool_calls"], results, strict=True)]
    final = respond(history, NOTE_TOOLS, HEALTHY)
    assert "tool_calls" not in final
    return final["content"]


@pytest.mark.parametrize(("text", "note"), [
    ("note: buy milk", "buy milk"),
    ("Note that the demo went well", "the demo went well"),
    ("add a note: ask Ana about the budget", "ask Ana about the budget"),
    ("Take a note the deadline is Friday", "the deadline is Friday"),
    ("remember to water the plants", "water the plants"),
    ("Please remember that the margin is 20 s", "the margin is 20 s"),
    ("note: buy 2-3 apples at 5 pm in Tokyo", "buy 2-3 apples at 5 pm in Tokyo"),  # no sum, no time: the note
])  # fmt: skip
def test_a_message_asking_for_a_note_calls_add_note_with_its_text(text, note):
    assert _calls(respond([{"role": "user", "content": text}], NOTE_TOOLS, HEALTHY)) == [("add_note", {"text": note})]


@pytest.mark.parametrize("text", ["Do you remember what I said?", "what are my notes?", "footnote: x", "note:",
                                  "Notes on the deadline, please"])
def test_a_message_that_asks_for_no_note_does_not_call_add_note(text):
    message = respond([{"role": "user", "content": text}], NOTE_TOOLS, HEALTHY)
    calls = _calls(message) if message.get("tool_calls") else []
    assert "add_note" not in [name for name, _ in calls]


def test_a_note_and_a_sum_come_in_one_reply_in_the_order_asked():
    message = respond([{"role": "user", "content": "what is 2+3 and note: call Bob"}], NOTE_TOOLS, HEALTHY)
    assert _calls(message) == [("calculator", {"expression": "2+3"}), ("add_note", {"text": "call Bob"})]
    assert [c["id"] for c in message["tool_calls"]] == ["call_1", "call_2"]
    first = respond([{"role": "user", "content": "Note: call Bob. What is 2+3?"}], NOTE_TOOLS, HEALTHY)
    assert _calls(first) == [("add_note", {"text": "call Bob."}), ("calculator", {"expression": "2+3"})]


def test_the_answer_says_the_note_was_added_with_the_tools_confirmation():
    answer = _answered("what is 2+3 and note: call Bob", ["5", "Added note 3 to notes.txt."])
    assert "**2+3 = 5**" in answer and "I added your note “call Bob”. Added note 3 to notes.txt." in answer


@pytest.mark.parametrize(("result", "reason"), [
    (DECLINED, "a person declined this tool call."),
    (EXPIRED, "nobody answered the request to approve this tool call within 10 minutes, so it expired."),
    ("Error: the notes file is full (1024 KiB): the note was not added", "the notes file is full (1024 KiB)"),
])  # fmt: skip
def test_a_note_declined_expired_or_failed_is_said_not_added_with_the_reason(result, reason):
    answer = _answered("what is 2+3 and note: call Bob", ["5", result])
    assert "**2+3 = 5**" in answer
    assert f"I did not add the note “call Bob”: {reason}" in answer
    assert "I added" not in answer


def test_a_note_without_the_add_note_tool_is_named_as_not_done():
    message = respond([{"role": "user", "content": "note: buy milk"}], TOOLS, HEALTHY)
    assert "tool_calls" not in message and "`add_note` (text='buy milk')" in message["content"]


def test_the_demo_says_it_can_take_notes():
    assert "note: buy milk" in respond([{"role": "user", "content": "hello"}], NOTE_TOOLS, HEALTHY)["content"]


def test_model_names_parse_into_scenarios_with_latency_and_writing_rate():
    assert parse_model_name("demo") == Scenario("healthy", DEFAULT_LATENCY_S, DEFAULT_STREAM_CPS)
    assert parse_model_name("demo@1.0") == Scenario("healthy", 1.0)
    assert parse_model_name("demo:slow") == Scenario("slow", 3.0)
    assert parse_model_name("demo:flaky@0.2") == Scenario("flaky", 0.2)
    assert parse_model_name("demo:slow-tool").name == "slow-tool"
    assert parse_model_name("demo@0.05~0") == Scenario("healthy", 0.05, 0.0)
    assert parse_model_name("demo:flaky~25") == Scenario("flaky", 0.05, 25.0)
    for bad in ("gpt-4o", "demo:nope", "demo@abc", "demo@-1", "demo@nan", "demo:", "demo~", "demo~-1", "demo~inf",
                "demo~x", "demo@1~1e9"):
        with pytest.raises(UnknownModelError):
            parse_model_name(bad)


def test_a_scenarios_model_name_parses_back_to_it():
    for scenario in (Scenario(), Scenario("slow"), Scenario("healthy", 0.05, 0.0), Scenario("flaky", 1.5, 12.5),
                     Scenario("trickle", 0.05, DEFAULT_STREAM_CPS)):
        assert parse_model_name(scenario.model_name) == scenario


def test_the_default_demo_shows_each_round_trip_and_writes_at_a_readable_pace():
    # The first impression: steps that land too fast to see, or an answer that appears at once,
    # hide what the product does.
    scenario = parse_model_name(DEMO.default_model)
    assert 0.5 <= scenario.latency_s <= 1.0
    assert 40 <= scenario.stream_cps <= 80


# --- the provider's HTTP behaviour, without sockets ---


def _post(provider: DemoProvider, body: dict | bytes, path: str = "/v1/chat/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return provider(Request("POST", path, {"content-type": "application/json"}, data))


def _served(action) -> Reply:
    """The reply an action ends in, with the delay before it."""
    assert isinstance(action, Delayed), action
    assert isinstance(action.then, Reply), action.then
    return action.then


def test_a_chat_request_gets_the_models_reply_after_the_scenarios_latency():
    action = _post(DemoProvider(), _chat("demo@0.25"))
    assert action.seconds == 0.25
    completion = json.loads(_served(action).body)
    assert completion["model"] == "demo@0.25"
    assert _call(completion["choices"][0]["message"]) == ("calculator", {"expression": "17*23"})


def test_flaky_answers_429_then_500_then_the_reply_for_each_round_trip():
    provider = DemoProvider()
    first, second, third = (_served(_post(provider, _chat("demo:flaky"))) for _ in range(3))
    assert (first.status, second.status, third.status) == (429, 500, 200)
    assert first.headers == {"Retry-After": "1"}
    assert _served(_post(provider, _chat("demo:flaky", "another question"))).status == 429  # its own count


def test_hang_and_trickle_are_actions_not_replies():
    assert _post(DemoProvider(), _chat("demo:hang")) == Hang(HANG_CAP_S)
    trickled = _post(DemoProvider(), _chat("demo:trickle")).then
    assert isinstance(trickled, Trickle) and trickled.bytes_per_second == 1.0
    assert json.loads(trickled.body)["object"] == "chat.completion"


ANSWERED = [{"role": "user", "content": "What is 17*23?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator",
                                                                  "arguments": '{"expression": "17*23"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "391"}]


def _stream_text(stream: Stream) -> list[str]:
    """The content pieces of a demo stream, in order."""
    chunks = [json.loads(part.decode().removeprefix("data: ")) for part in stream.parts[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    return [piece for piece in pieces if piece]


def test_a_streaming_request_gets_server_sent_events_at_the_scenarios_rate():
    action = _post(DemoProvider(), {"model": "demo@0.25~40", "messages": ANSWERED, "tools": TOOLS, "stream": True,
                                    "stream_options": {"include_usage": True}})
    assert action.seconds == 0.25
    stream = action.then
    assert isinstance(stream, Stream) and not stream.stall
    assert stream.parts[-1] == b"data: [DONE]\n\n"
    pieces = _stream_text(stream)
    assert "".join(pieces) == "**17*23 = 391**"
    # 40 characters a second, in pieces one interval apart.
    assert len(pieces) > 5 and abs(len(pieces[0]) / stream.interval_s - 40) < 1
    last = json.loads(stream.parts[-2].decode().removeprefix("data: "))
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0


def test_a_long_answer_is_written_faster_so_it_fits_the_demo_clocks():
    action = _post(DemoProvider(), {**_chat("demo@0~60", "hello", tools=[]), "stream": True})
    stream = action.then
    text = "".join(_stream_text(stream))
    assert len(text) / 60 > MAX_WRITING_S  # at 60 characters a second it would take longer
    assert len(stream.parts) * stream.interval_s <= MAX_WRITING_S + 3 * stream.interval_s


def test_a_streamed_tool_call_comes_as_openai_sends_one():
    action = _post(DemoProvider(), {**_chat("demo@0~0"), "stream": True})
    chunks = [json.loads(part.decode().removeprefix("data: ")) for part in action.then.parts[:-1]]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["id"] == "call_1" and calls[0]["function"]["name"] == "calculator"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"expression": "17*23"}
    assert action.then.interval_s == 0  # ~0: everything at once
    assert all("usage" not in c for c in chunks)  # not asked for


def test_a_reply_of_two_calls_streams_each_under_its_own_index():
    action = _post(DemoProvider(), {**_chat("demo@0~0", "what is 2+3 and note: call Bob", NOTE_TOOLS), "stream": True})
    chunks = [json.loads(part.decode().removeprefix("data: ")) for part in action.then.parts[:-1]]
    parts = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls") or []]
    by_index = {i: "".join(p["function"]["arguments"] for p in parts if p["index"] == i) for i in (0, 1)}
    assert [p["function"]["name"] for p in parts if "id" in p] == ["calculator", "add_note"]
    assert json.loads(by_index[1]) == {"text": "call Bob"}


def test_bad_requests_get_openai_shaped_errors():
    provider = DemoProvider()
    cases = [(_post(provider, b"{not json"), 400, "invalid_request"),
             (_post(provider, _chat("demo:nope")), 404, "model_not_found"),
             (_post(provider, _chat("demo"), "/v1/embeddings"), 404, "not_found"),
             (provider(Request("GET", "/v1/nothing")), 404, "not_found")]
    for action, status, code in cases:
        assert action.status == status
        assert json.loads(action.body)["error"]["code"] == code


def test_models_and_health_are_listed():
    provider = DemoProvider()
    assert provider(Request("GET", "/healthz")) == reply(200, {"status": "ok"})
    models = json.loads(provider(Request("GET", "/v1/models?x=1")).body)["data"]
    assert "demo:flaky" in [m["id"] for m in models]


# --- the server ---


@pytest.fixture
def server():
    with DemoServer() as running:
        yield running


def test_server_refuses_to_bind_anything_but_loopback():
    with pytest.raises(ValueError):
        LoopbackServer(DemoProvider(), host="0.0.0.0")


def test_chat_completion_round_trip(server):
    with httpx.Client(base_url=server.url, timeout=5) as client:
        assert client.get(server.url.removesuffix("/v1") + "/healthz").status_code == 200
        assert "demo:flaky" in [m["id"] for m in client.get("/models").json()["data"]]
        response = client.post("/chat/completions", json=_chat("demo"))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "demo"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert _call(choice["message"]) == ("calculator", {"expression": "17*23"})
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_the_demo_model_streams_its_answer_to_the_provider_at_the_rate_asked(server):
    provider = OpenAIProvider(server.url, "demo@0~50", None)
    arrivals: list[tuple[float, str]] = []
    started = time.monotonic()
    completion = provider.complete([{"role": "user", "content": "hello"}], [], CallTimeout(30.0, 5.0),
                                   on_text=lambda text: arrivals.append((time.monotonic(), text)))
    assert "".join(text for _, text in arrivals) == completion.content
    assert completion.content.startswith("Hello!") and completion.usage.output_tokens > 0
    # Written over time, not at once: at 50 characters a second (or in MAX_WRITING_S, if shorter).
    assert len(arrivals) > 10
    assert arrivals[-1][0] - started >= min(len(completion.content) / 50, MAX_WRITING_S) * 0.8


def test_flaky_gives_429_with_retry_after_then_500_then_200(server):
    with httpx.Client(base_url=server.url, timeout=5) as client:
        statuses = []
        for _ in range(3):
            response = client.post("/chat/completions", json=_chat("demo:flaky@0"))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.headers["Retry-After"] == "1"
                assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert statuses == [429, 500, 200]


def test_trickle_sends_the_body_one_byte_a_second(server):
    with httpx.Client(base_url=server.url, timeout=5) as client:
        with client.stream("POST", "/chat/completions", json=_chat("demo:trickle@0")) as response:
            assert response.status_code == 200
            assert int(response.headers["Content-Length"]) > 50
            arrivals = []
            for chunk in response.iter_raw():
                arrivals.extend([time.monotonic()] * len(chunk))
                if len(arrivals) >= 3:
                    break
    gaps = [later - earlier for earlier, later in zip(arrivals[:2], arrivals[1:3], strict=True)]
    assert all(0.5 < gap < 10.0 for gap in gaps), gaps  # spaced out; a busy machine only adds to a gap


def test_hang_holds_the_connection_and_stop_returns_promptly():
    server = DemoServer().start()
    try:
        with httpx.Client(base_url=server.url, timeout=1) as client:
            started = time.monotonic()
            with pytest.raises(httpx.ReadTimeout):
                client.post("/chat/completions", json=_chat("demo:hang"))
            assert time.monotonic() - started < 10  # the client's 1 s timeout, not an answer
        # A second hanging request stays open while the server stops.
        hanging = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1].split("/")[0])))
        body = json.dumps(_chat("demo:hang")).encode()
        hanging.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.2)
    finally:
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 10  # not held up by the hanging request
    hanging.settimeout(3)
    assert hanging.recv(1024) == b""  # the handler ended and closed the connection without answering
    hanging.close()


def test_unknown_model_is_404_model_not_found(server):
    response = httpx.post(f"{server.url}/chat/completions", json=_chat("demo:nope"), timeout=5)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_malformed_json_is_400(server):
    response = httpx.post(
        f"{server.url}/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}, timeout=5
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_many_concurrent_slow_calls_are_served_in_parallel(server):
    import concurrent.futures

    def one_call(_: int) -> int:
        return httpx.post(f"{server.url}/chat/completions", json=_chat("demo@1.0"), timeout=60).status_code

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=100) as pool:
        statuses = list(pool.map(one_call, range(100)))
    assert statuses == [200] * 100
    # The property is parallelism, not speed: in series these take 100 s; a busy machine may
    # stretch the parallel run to several seconds, never to a third of the serial time.
    assert time.monotonic() - started < SERIAL_100_CALLS_S * 0.3


def test_a_docs_question_gets_a_short_answer_without_tables():
    # Before: the reply quoted every passage found, a reliability table included (a 4,000 px page).
    from agent.demo.model import DOCS_ANSWER_CHARS, docs_answer
    from agent.tools.docs import search_docs

    for question in ("How does the deadline work?", "reliability table", "stop button", "worker pool"):
        result = search_docs(question)
        reply = docs_answer(result)
        assert reply.startswith("From the docs (")
        assert len(reply) < DOCS_ANSWER_CHARS + 200, reply
        assert "| ---" not in reply and "\n> |" not in reply
