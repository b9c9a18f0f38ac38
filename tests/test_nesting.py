"""JSON nested deeper than bounded_json.MAX_DEPTH, in every shape (objects, arrays, mixed), at depths around
the bound and far past it, on every path JSON takes into the agent: a model's tool-call arguments (OpenAI
plain and streamed, Anthropic plain and streamed with input_json_delta), a Python tool's value, an MCP tool's
result, what Redis holds, and what reads the state (export, trace, page). Through the real queue and workers:
no RecursionError anywhere, a deep tool call is a tool error the model gets and the turn goes on to its
answer, and the words a person reads say the JSON is nested too deeply."""

from __future__ import annotations

import json
import random
import sys

import pytest

from agent import bounded_json, tracing
from agent.bounded_json import MAX_DEPTH, TOO_DEEP, TooDeep
from agent.conversation import export
from agent.providers.anthropic import MessageStream, parse_message
from agent.providers.base import Completion, ProviderError, ToolCall
from agent.providers.http import decode_json
from agent.providers.openai import ChatStream, parse_completion
from agent.providers.sse import EventStreamParser
from agent.queue import new_id, submit_turn
from agent.tools import mcp
from agent.tools.catalogue import read_catalogue
from agent.tools.registry import ToolError, check_arguments, make_tool
from agent.tools.running import run_tool
from agent.turn.response_limits import MAX_ARGUMENTS_CHARS, bound_response
from harness.pools import stop_pool
from harness.private_redis import PrivateRedis
from harness.waiting import wait_for
from tests import sse_server as sse
from tests.apptest_page import app as page
from tests.apptest_page import page_environment, texts
from tests.conftest import FAST, ROOT, cpu_seconds, start_pool, wait_done
from tests.deep_json import SHAPES, deep_value, depth_of, nested_text, nested_value
from tests.scripted_server import chat_reply, tool_call

DEPTHS = (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 900, 10_000)
CASES = [(shape, depth) for shape in SHAPES for depth in DEPTHS]  # 15: a response may run 16 calls
MCP_ENVELOPE = 2  # levels a JSON-RPC line adds around a result's structured content (the line is what is bounded)
MCP_DEPTHS = tuple(depth - MCP_ENVELOPE for depth in DEPTHS[:3]) + DEPTHS[3:]
HOSTILE = str(ROOT / "tests" / "mcp_hostile_server.py")
ANSWER = "All checked."
TURN_TIMEOUT_S = 60
BODY_BYTES = 8 * 1024 * 1024  # the most a provider's reply may be (agent.providers.http.MAX_RESPONSE_BYTES)
SCAN_CPU_S = 1.5  # CPU seconds the depth scan may take on an 8 MiB body (measured here: at most 0.6 s)


def reference_depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    return 0


def refused(depth: int, limit: int = MAX_DEPTH) -> bool:
    return depth > limit


# -- the decoder itself ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_the_bounded_decoder_refuses_exactly_what_nests_past_the_bound_in_words(shape, depth):
    text = nested_text(depth, shape)
    assert bounded_json.exceeds(text) is refused(depth)
    assert bounded_json.exceeds(text.encode()) is refused(depth)
    if refused(depth):
        with pytest.raises(TooDeep, match=f"{TOO_DEEP} \\(more than {MAX_DEPTH} levels"):
            bounded_json.loads(text)
        with pytest.raises(TooDeep):
            bounded_json.check(nested_value(depth, shape))
    else:
        assert bounded_json.loads(text) == nested_value(depth, shape)
        assert bounded_json.check(nested_value(depth, shape)) == nested_value(depth, shape)


def test_the_bounded_decoder_agrees_with_a_reference_on_random_json_with_brackets_inside_strings():
    rng = random.Random(20261203)

    def value(levels: int):
        if levels == 0 or rng.random() < 0.2:
            return rng.choice([1, None, '[{"\\', "]]}}", "x"])
        if rng.random() < 0.5:
            return [value(levels - 1) for _ in range(rng.randint(0, 3))]
        return {f'{i}"[{{': value(levels - 1) for i in range(rng.randint(0, 3))}

    for _ in range(1500):
        item = value(rng.randint(0, 12))
        text, depth = json.dumps(item), reference_depth(item)
        for bound in range(8):
            assert bounded_json.exceeds(text, bound) is (depth > bound), (text, bound)
            cut = bounded_json.loads(text, max_depth=bound, cut=True)
            assert json.loads(bounded_json.dumps(cut)) == item  # a cut part is written back as it came
            assert reference_depth(cut) <= bound  # a Cut is a leaf: what stays a value is within the bound


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_a_cut_keeps_each_too_deep_part_as_its_text_and_the_rest_as_values(shape, depth):
    inner = nested_text(depth, shape)
    text = '{"input":' + inner + ',"n":[1,"]]]"]}'
    value = bounded_json.loads(text, cut=True)
    assert value["n"] == [1, "]]]"]
    assert bounded_json.dumps(value, separators=(",", ":")) == text


@pytest.mark.parametrize("name, body", [
    ("brackets alternating", "[" + "[]," * (BODY_BYTES // 3 - 1) + "[]]"),
    ("brackets nested", "[" * (BODY_BYTES // 2) + "]" * (BODY_BYTES // 2)),
    ("brackets in steps", "[" + ",".join(["[" * 60 + "]" * 60] * (BODY_BYTES // 121)) + "]"),
    ("brackets in one string", json.dumps({"content": "[{" * (BODY_BYTES // 2)})),
    ("brackets and quotes in strings", json.dumps(['"[\\{'] * (BODY_BYTES // 10))),
    ("objects", json.dumps([{"a": 1, "b": [1, 2, {"c": "d"}]} for _ in range(BODY_BYTES // 35)])),
])
def test_the_depth_scan_of_an_8_mib_body_is_linear(name, body):
    assert len(body) >= BODY_BYTES * 0.9
    assert cpu_seconds(bounded_json.exceeds, body) < SCAN_CPU_S, name


# -- each boundary, in the process ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_tool_arguments_nested_too_deeply_are_a_tool_error_that_says_so(shape, depth):
    tool = make_tool(depth_of)
    text = nested_text(depth, shape)
    if refused(depth):
        with pytest.raises(ToolError, match=f"arguments for depth_of are {TOO_DEEP}"):
            check_arguments(tool, text)
    else:
        assert depth_of(**check_arguments(tool, text)) == f"{depth} levels"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_arguments_too_long_and_too_deep_are_refused_naming_both(shape, depth):
    text = nested_text(depth, shape)
    (planned,) = bound_response(Completion(None, [ToolCall("call_1", "depth_of", text)])).calls
    if len(text) > MAX_ARGUMENTS_CHARS:
        assert "too long" in planned.refusal and (TOO_DEEP in planned.refusal) is refused(depth)
    else:
        assert planned.refusal is None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_a_python_tool_returning_a_value_nested_too_deeply_is_a_tool_error_that_says_so(shape, depth, monkeypatch):
    from agent.tools import registry

    monkeypatch.setitem(registry.REGISTRY, "deep_value", make_tool(deep_value, source="tests.deep_json"))
    result = run_tool("deep_value", json.dumps({"depth": depth, "shape": shape}), timeout_s=10)
    assert result.ok is not refused(depth), result.output
    if refused(depth):
        assert result.output.startswith(f"Error: deep_value returned a value {TOO_DEEP}")
    else:
        assert json.loads(result.output) == nested_value(depth, shape)


class _Result:
    def __init__(self, structured):
        self.content, self.structured_content = [], structured


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_an_mcp_result_nested_too_deeply_is_refused_in_words(shape, depth):
    result = _Result(nested_value(depth, shape))
    if refused(depth):
        with pytest.raises(TooDeep):
            mcp.result_text(result)
    else:
        assert json.loads(mcp.result_text(result)) == nested_value(depth, shape)


def _anthropic_body(inputs: list[str]) -> str:
    blocks = ",".join(f'{{"type":"tool_use","id":"toolu_{i}","name":"depth_of","input":{raw}}}'
                      for i, raw in enumerate(inputs))
    return '{"type":"message","role":"assistant","content":[' + blocks + '],"usage":{"input_tokens":1}}'


def _anthropic_stream(inputs: list[str]) -> list[bytes]:
    events = [sse.message_start()]
    for index, raw in enumerate(inputs):
        pieces = [raw[i:i + 4096] for i in range(0, len(raw), 4096)]  # split anywhere, as a server may
        events += sse.tool_block(index, f"toolu_{index}", "depth_of", *pieces)
    return [*events, *sse.message_end(stop_reason="tool_use")]


def _openai_stream(arguments: list[str]) -> list[bytes]:
    events = [sse.chunk({"role": "assistant", "content": None})]
    for index, text in enumerate(arguments):
        pieces = [text[i:i + 4096] for i in range(0, len(text), 4096)] or [""]
        events.append(sse.call_delta(index, call_id=f"call_{index}", name="depth_of", arguments=pieces[0]))
        events += [sse.call_delta(index, arguments=piece) for piece in pieces[1:]]
    return [*events, sse.chunk(finish_reason="tool_calls"), sse.DONE]


def _streamed(assembler, events: list[bytes]):
    parser = EventStreamParser()
    for event in events:
        assembler.take(parser.feed(event))
    return assembler.result()


READERS = {
    "openai plain": lambda texts: parse_completion(decode_json(json.dumps(
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
            tool_call("depth_of", text, f"call_{i}") for i, text in enumerate(texts)]}}]}))),
    "openai streamed": lambda texts: _streamed(ChatStream(None, None), _openai_stream(texts)),
    "anthropic plain": lambda texts: parse_message(decode_json(_anthropic_body(texts), cut=True)),
    "anthropic streamed": lambda texts: _streamed(MessageStream(None, None), _anthropic_stream(texts)),
}


@pytest.mark.parametrize("reader", READERS)
def test_every_reply_format_hands_deep_arguments_on_as_sent_for_the_tool_layer_to_refuse(reader):
    sent = [nested_text(depth, shape) for shape, depth in CASES]
    completion = READERS[reader](sent)
    assert [json.loads(call.arguments) for call, (_, depth) in zip(completion.tool_calls, CASES, strict=True)
            if depth < 900] == [json.loads(text) for text, (_, depth) in zip(sent, CASES, strict=True) if depth < 900]
    for call, text in zip(completion.tool_calls, sent, strict=True):
        assert bounded_json.exceeds(call.arguments) is bounded_json.exceeds(text)  # nothing lost, nothing made up


@pytest.mark.parametrize("written", ["plain", "escaped", "escaped after an escaped backslash"])
def test_the_key_in_a_too_deep_tool_input_is_redacted_however_it_is_written(written):
    from tests.conftest import CANARY_KEY

    escaped = "".join(f"\\u{ord(c):04x}" for c in CANARY_KEY)
    key = {"plain": CANARY_KEY, "escaped": escaped, "escaped after an escaped backslash": "\\\\" + escaped}[written]
    deep = '{"a":' + "[" * 900 + '"' + key + '"' + "]" * 900 + "}"
    (call,) = parse_message(decode_json(_anthropic_body([deep]), secret=CANARY_KEY, cut=True)).tool_calls
    assert CANARY_KEY not in call.arguments and escaped not in call.arguments and "[redacted]" in call.arguments
    assert bounded_json.exceeds(call.arguments)  # still refused by the tool layer for its depth


def test_a_reply_nested_too_deeply_outside_any_tool_input_is_malformed_in_words():
    body = '{"choices":' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(ProviderError, match=f"the body is {TOO_DEEP}"):
        decode_json(body)


# -- through the real queue and workers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    """A private Redis, one worker with the deep tools (tests/deep_json.py) and the hostile MCP server."""
    folder = tmp_path_factory.mktemp("nesting")
    config = folder / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"hostile": {"command": sys.executable, "args": [HOSTILE]}}}))
    with PrivateRedis(folder / "redis") as private:
        handle = start_pool(private.url, 1, folder / "pool.log",
                            {"AGENT_TOOLS": "tests.deep_json", "AGENT_MCP_CONFIG": str(config)})
        try:
            wait_for(lambda: len(read_catalogue(private.client)) == 3, 60, "three tool sources in the catalogue")
            yield private, folder / "pool.log"
        finally:
            stop_pool(handle, private.url)


def _anthropic_answer() -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "text", "text": ANSWER}],
            "usage": {"input_tokens": 1, "output_tokens": 1}}


def _first_reply(path: str, texts: list[str]):
    from agent.runtime.loopback_server import reply, stream

    json_type = {"content-type": "application/json"}
    if path == "openai plain":
        return chat_reply(None, [tool_call("depth_of", text, f"call_{i}") for i, text in enumerate(texts)])
    if path == "openai streamed":
        return stream(_openai_stream(texts))
    if path == "anthropic plain":
        return reply(200, body=_anthropic_body(texts), headers=json_type)
    return stream(_anthropic_stream(texts))


def _run(backend, scripted, provider: str, first, message: str) -> dict:
    from agent.runtime.loopback_server import reply

    private, log_path = backend
    answer = chat_reply(ANSWER) if provider == "openai" else reply(200, _anthropic_answer())
    scripted.add(first, answer)
    base_url = scripted.url + ("/v1" if provider == "openai" else "")
    config = FAST.with_changes(provider=provider, model="scripted", base_url=base_url, job_timeout_s=40,
                               deadline_margin_s=5.0, call_timeout_cap_s=20.0)
    cid = new_id()
    submit_turn(private.store, private.queue, cid, message, config)
    state = wait_done(private.store, cid, timeout_s=TURN_TIMEOUT_S)
    assert "RecursionError" not in log_path.read_text(errors="replace")
    return state


def _assert_carried_on(state: dict, scripted, expected: list, case_names: list) -> None:
    """The turn ended `done` with the model's answer; each tool result is what `expected` says (a text, or a
    value as JSON), or for None an error naming the nesting; the model's second call got those results."""
    assert state["status"] == "done" and state["history"][-1]["content"] == ANSWER, state["history"][-1]
    results = [m["content"] for m in state["history"] if m["role"] == "tool"]
    assert len(results) == len(expected), results
    for result, wanted, case in zip(results, expected, case_names, strict=True):
        if wanted is None:
            assert result.startswith("Error:") and TOO_DEEP in result, (case, result)
        elif isinstance(wanted, str):
            assert result == wanted, (case, result[:200])
        else:
            assert json.loads(result) == wanted, (case, result[:200])
    second = scripted.requests[1].body.decode()
    assert second.count(TOO_DEEP) >= expected.count(None)  # the errors went back to the model
    assert "RecursionError" not in json.dumps(state) and "went wrong" not in json.dumps(state)


@pytest.mark.parametrize("path", READERS)
def test_a_model_sending_deep_arguments_gets_tool_errors_and_the_turn_carries_on_to_its_answer(
        backend, scripted, path):
    texts_sent = [nested_text(depth, shape) for shape, depth in CASES]
    state = _run(backend, scripted, path.split()[0], _first_reply(path, texts_sent), "How deep are these?")
    _assert_carried_on(state, scripted, [None if refused(d) else f"{d} levels" for _, d in CASES], CASES)
    steps = [s for s in state["steps"] if s["kind"] == "tool"]
    assert [s["outcome"] for s in steps] == ["error" if refused(d) else "ok" for _, d in CASES]


def test_a_python_tool_returning_deep_values_gives_tool_errors_and_the_turn_carries_on(backend, scripted):
    calls = [tool_call("deep_value", {"depth": d, "shape": s}, f"call_{i}") for i, (s, d) in enumerate(CASES)]
    state = _run(backend, scripted, "openai", chat_reply(None, calls), "Make deep values")
    expected = [None if refused(d) else nested_value(d, s) for s, d in CASES]
    _assert_carried_on(state, scripted, expected, CASES)


def test_an_mcp_tool_answering_deep_results_gives_tool_errors_and_the_turn_carries_on(backend, scripted):
    cases = [(shape, depth) for shape in SHAPES for depth in MCP_DEPTHS]
    calls = [tool_call("hostile__deep", {"depth": d, "shape": s}, f"call_{i}") for i, (s, d) in enumerate(cases)]
    state = _run(backend, scripted, "openai", chat_reply(None, calls), "Ask the server for deep values")
    expected = [None if refused(d + MCP_ENVELOPE) else nested_value(d, s) for s, d in cases]
    _assert_carried_on(state, scripted, expected, cases)


# -- what reads the state: the store, export, trace, page --------------------------------------------------


def _deep_state(private, shape: str, depth: int) -> str:
    """A real conversation, then a message, a step and a turn summary that nest `depth` deep written into Redis."""
    from agent.conversation.keys import Keys
    from tests.hostile_states import base_state

    cid, _ = base_state(private.store, "done")
    keys, inner, client = Keys.of(cid), nested_text(depth - 1, shape), private.client
    turn = client.hget(keys.meta, "tip").decode()  # its tree's last turn (agent/conversation/scripts/included/tree.lua)
    n = client.hincrby(keys.tree, f"{turn}:n", 1)
    client.hset(keys.tree, f"{turn}:m:{n - 1}", '{"role":"assistant","content":"deep","extra":' + inner + "}")
    s = int(client.hget(keys.tree, f"{turn}:s"))
    step = json.loads(client.hget(keys.tree, f"{turn}:s:{s - 1}"))
    client.hset(keys.tree, f"{turn}:s:{s}", json.dumps(step)[:-1] + ',"extra":' + inner + "}")
    client.hincrby(keys.tree, f"{turn}:s", 1)
    client.hincrby(keys.tree, f"{turn}:v", 1)
    first = client.hget(keys.tree, f"{turn}:parent").decode()  # the turn before: the last one's is traced
    summary = client.hget(keys.tree, f"{first}:sum").decode()
    client.hset(keys.tree, f"{first}:sum", summary[:-1] + ',"extra":' + inner + "}")
    client.hincrby(keys.tree, f"{first}:v", 1)
    return cid


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    with PrivateRedis(tmp_path_factory.mktemp("nesting-store")) as private:
        yield private


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_values_in_redis_read_back_as_placeholders_that_say_so_and_export_and_trace(stored, shape, depth):
    cid = _deep_state(stored, shape, depth)
    state = stored.store.read(cid)
    said = json.dumps(state)
    assert (TOO_DEEP in said) is refused(depth) and "RecursionError" not in said
    assert (state["history"][-1].get("content") == "deep") is not refused(depth)
    markdown = export.to_markdown(state)
    assert (TOO_DEEP in markdown) is refused(depth)
    json.loads(export.to_json(state))
    spans = _trace(state)
    assert spans, "the turn's spans were built"


def _trace(state: dict) -> list:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        tracing.export_turn(tracing._tracer, state, state["turn_id"])
        return list(exporter.get_finished_spans())
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def test_a_tool_catalogue_nested_too_deeply_in_redis_reads_as_no_sources(stored):
    from agent.tools.catalogue import CATALOGUE_KEY

    stored.client.set(CATALOGUE_KEY, '{"sources":' + nested_text(10_000, "mixed") + "}")
    assert read_catalogue(stored.client) == []
    stored.client.set(CATALOGUE_KEY, '{"sources":[' + nested_text(MAX_DEPTH - 2, "mixed") + "]}")
    assert read_catalogue(stored.client) == [nested_value(MAX_DEPTH - 2, "mixed")]


PAGE_ENV = {"AGENT_PROVIDER": "demo", "AGENT_MODEL": "demo", "AGENT_WORKERS": "0", "AGENT_MCP_CONFIG": "off"}


def test_the_page_draws_deep_stored_values_and_deep_tool_calls_saying_what_they_are(backend, scripted):
    """Stored values past the bound, and a real turn's deep tool calls, drawn with no traceback; the page says
    `nested too deeply` where a value was one."""
    private, _ = backend
    deep_cids = [_deep_state(private, shape, 900) for shape in SHAPES]
    turn = _run(backend, scripted, "openai", _first_reply("openai plain", [nested_text(900, "mixed")]), "Deep?")
    with page_environment(private.url, PAGE_ENV):
        for cid in [*deep_cids, turn["conversation_id"]]:
            at = page(cid)
            at.run()
            shown = texts(at)
            assert not at.exception, [e.value for e in at.exception]
            assert TOO_DEEP in shown and "Traceback" not in shown and "went wrong" not in shown, shown[-500:]

