"""OpenTelemetry traces of turns: the span tree of each ending, one trace across the submitting
process and a worker over real OTLP/HTTP, and a collector that is down or slow costing nothing."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from rq import Queue
from rq.serializers import JSONSerializer

from agent import tracing
from agent.conversation.well_formed import MAX_COUNT
from agent.hosting.lost_worker import lost_worker_check
from agent.providers import AnthropicProvider, OpenAIProvider
from agent.providers.base import Usage
from agent.queue import JOB_FUNCTION, SafeJob, job_id_for, new_id, submit_turn
from agent.runtime.connection import queue_client
from agent.runtime.loopback_server import LoopbackServer, hang, reply, stream
from harness import pools
from harness.private_redis import PrivateRedis
from harness.waiting import wait_for
from tests.conftest import CANARY_KEY, FAST, ROOT, ask, wait_done
from tests.scripted_server import chat_reply
from tests.sse_server import DONE, message_end, message_start, sse, text_block, text_chunks
from tests.test_app import begin
from tests.test_providers import SHORT

CONTENT_CANARY = "zebra-7c1d"  # a word of the user's message: never exported unless content capture is on
HUNG = dataclasses.replace(FAST, model="demo:hang~0")
LOOPING = dataclasses.replace(FAST, model="demo:loop~0", max_steps=2)
TWO_TOOLS = f"What is 17*23, and what time is it in Tokyo? {CONTENT_CANARY}"


@pytest.fixture
def spans():
    """The SDK's in-memory exporter behind this process's tracer; tracing off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def traced(exporter: InMemorySpanExporter, store, cid: str) -> dict:
    """The turn's spans as the worker would export them, built from the final state: name -> [span]."""
    state = store.read(cid)
    tracing.export_turn(tracing._tracer, state, state["turn_id"])
    by_name: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    return by_name


def the(by_name: dict, name: str):
    assert len(by_name.get(name, [])) == 1, f"{name}: {sorted(by_name)}"
    return by_name[name][0]


def event_names(span) -> list[str]:
    return [event.name for event in span.events]


@pytest.mark.usefixtures("pool")
class TestTheSpanTreeOfEachEnding:
    def test_an_answered_turn_is_one_trace_from_submit_to_ending(self, spans, store, queue):
        cid = ask(store, queue, TWO_TOOLS)
        state = wait_done(store, cid)
        by_name = traced(spans, store, cid)
        submit, turn = the(by_name, tracing.SUBMIT_SPAN), the(by_name, tracing.TURN_SPAN)
        assert {span.context.trace_id for spans_ in by_name.values() for span in spans_} == {submit.context.trace_id}
        assert submit.parent is None and turn.parent.span_id == submit.context.span_id
        assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert turn.attributes["agent.clock.job_timeout_s"] == FAST.job_timeout_s
        assert turn.attributes["agent.clock.deadline_at"] == state["deadline_at"]
        assert turn.attributes["agent.clock.job_timeout_at"] == state["job_timeout_at"]
        assert turn.status.status_code == StatusCode.OK and event_names(turn) == ["ending"]
        queue_wait = the(by_name, tracing.QUEUE_SPAN)
        assert queue_wait.parent.span_id == turn.context.span_id
        assert queue_wait.end_time == int(state["started_at"] * 1e9)

        calls = by_name[f"chat {FAST.model}"]
        assert len(calls) == 3  # calculator, current_time, the answer
        for call in calls:
            assert call.parent.span_id == turn.context.span_id
            assert call.attributes["gen_ai.provider.name"] == "demo"
            assert call.attributes["gen_ai.request.model"] == FAST.model
            assert 0 < call.attributes["agent.clock.timeout_s"] <= FAST.call_timeout_cap_s
            assert call.attributes["agent.clock.remaining_s"] > 0
        assert [c.attributes["gen_ai.response.finish_reasons"] for c in sorted(calls, key=lambda c: c.start_time)] \
            == [("tool_calls",), ("tool_calls",), ("stop",)]
        call_ids = [c["id"] for m in state["history"] for c in m.get("tool_calls") or []]
        tools = by_name["execute_tool calculator"] + by_name["execute_tool current_time"]
        assert sorted(t.attributes["gen_ai.tool.call.id"] for t in tools) == sorted(call_ids)
        for tool in tools:
            assert tool.parent.span_id == turn.context.span_id
            assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
            assert 0 < tool.attributes["agent.clock.timeout_s"]
            assert "gen_ai.tool.call.arguments" not in tool.attributes  # no content by default
        assert turn.start_time <= min(s.start_time for s in calls + tools)
        assert turn.end_time >= max(s.end_time for s in calls + tools)

    def test_a_turn_that_ran_out_of_time_is_an_error_with_its_timed_out_call(self, spans, store, queue):
        cid = ask(store, queue, "What is 2+2?", HUNG)
        assert wait_done(store, cid)["status"] == "timed_out"
        by_name = traced(spans, store, cid)
        turn = the(by_name, tracing.TURN_SPAN)
        assert turn.status.status_code == StatusCode.ERROR
        assert turn.attributes["agent.turn.status"] == "timed_out"
        assert turn.events[-1].name == "ending" and turn.events[-1].attributes["agent.turn.status"] == "timed_out"
        timed_out = [s for s in by_name["chat demo:hang~0"] if s.attributes["agent.step.outcome"] == "timeout"]
        assert timed_out and all(s.status.status_code == StatusCode.ERROR for s in timed_out)
        assert all(s.attributes["error.type"] == "timeout" for s in timed_out)
        for call in timed_out:  # the clock it was given is on the span, and held
            timeout_s = call.attributes["agent.clock.timeout_s"]
            assert timeout_s - 0.5 <= (call.end_time - call.start_time) / 1e9 <= timeout_s + 1.5

    def test_a_stopped_turn_has_a_stop_event_and_is_cancelled(self, spans, store, queue):
        cid = ask(store, queue, "Please be slow 20 seconds, then tell me the time in Paris.")
        turn_id = wait_for(lambda: (s := store.read(cid)) and (s.get("current_step") or {}).get("kind") == "tool"
                           and s["turn_id"], 15, "the wait tool to start")
        store.request_cancel(turn_id, ttl_s=60)
        assert wait_done(store, cid)["status"] == "cancelled"
        by_name = traced(spans, store, cid)
        turn = the(by_name, tracing.TURN_SPAN)
        assert "stop" in event_names(turn)
        assert turn.status.status_code == StatusCode.ERROR and turn.attributes["error.type"] == "cancelled"
        wait_span = the(by_name, "execute_tool wait")
        assert wait_span.attributes["agent.step.outcome"] == "stopped"

    def test_a_failed_turn_is_an_error_naming_its_kind(self, spans, store, queue):
        cid = ask(store, queue, "What is 2+2?", LOOPING)
        state = wait_done(store, cid)
        assert state["status"] == "failed"
        turn = the(traced(spans, store, cid), tracing.TURN_SPAN)
        assert turn.status.status_code == StatusCode.ERROR
        assert turn.attributes["error.type"] == state["error"]["kind"] == "step_limit"

    def test_a_turn_whose_worker_was_killed_is_traced_by_the_front_end_that_ends_it(self, spans, store,
                                                                                       redis_client):
        # Enqueued on a queue no worker of this session serves: the job is then left as RQ leaves a
        # job whose SimpleWorker was SIGKILLed (started, long past its timeout, never finished). With no
        # resume allowed, the front end ends it (with one, it would queue it again: test_handover_seams.py).
        cid = new_id()
        queue = Queue("no-worker-" + new_id(), connection=redis_client, serializer=JSONSerializer, job_class=SafeJob)
        tid = submit_turn(store, queue, cid, "hi", FAST.with_changes(max_resumes=0))
        job = SafeJob.fetch(job_id_for(tid), connection=redis_client, serializer=JSONSerializer)
        job.started_at = datetime.now(UTC) - timedelta(seconds=FAST.job_timeout_s + 10)
        job.save()
        redis_client.hset(job.key, "status", "started")
        assert job.func_name == JOB_FUNCTION
        assert lost_worker_check(store, redis_client, cid) is True
        by_name = {}
        for span in spans.get_finished_spans():  # exported by the ending itself, in this (front end) process
            by_name.setdefault(span.name, []).append(span)
        turn = the(by_name, tracing.TURN_SPAN)
        assert turn.parent.span_id == the(by_name, tracing.SUBMIT_SPAN).context.span_id
        assert turn.status.status_code == StatusCode.ERROR and turn.attributes["error.type"] == "worker_lost"


def test_tracing_is_off_without_an_endpoint_and_with_the_sdk_disabled():
    assert not tracing.enabled({})
    assert tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"})


def test_a_traceparent_gives_its_trace_id_and_anything_else_none():
    assert tracing.trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == \
        "4bf92f3577b34da6a3ce929d0e0e4736"
    for bad in (None, "", "00-xyz-00f067aa0ba902b7-01", "garbage", "00-" + "g" * 32 + "-00f067aa0ba902b7-01"):
        assert tracing.trace_id(bad) is None


# -- over OTLP/HTTP, across processes ------------------------------------------------------------


class Collector:
    """A loopback OTLP/HTTP receiver that decodes what it gets with opentelemetry-proto."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self._request_type = ExportTraceServiceRequest
        self.raw: list[bytes] = []
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        self.server = LoopbackServer(self.handle, name="otlp").start()

    def handle(self, request):
        if request.method != "POST" or request.path != "/v1/traces":
            return reply(404, {})
        message = self._request_type()
        message.ParseFromString(request.body)
        with self.lock:
            self.raw.append(request.body)
            for resource_spans in message.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(), "resource": resource,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "status": span.status.code, "events": [e.name for e in span.events]})
        return reply(200, body=b"", headers={"content-type": "application/x-protobuf"})

    def named(self, name: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]


def _value(value):
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector():
    receiver = Collector()
    try:
        yield receiver
    finally:
        receiver.server.stop()


def otel_env(endpoint: str, **extra: str) -> dict:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "agent-test", **extra}


def traced_cli(tmp_path, base_env, endpoint: str, message: str, **extra: str):
    """A private Redis, one worker and the CLI, all exporting to `endpoint`; returns (result, CLI pid)."""
    with PrivateRedis(tmp_path / "redis") as server:
        env = otel_env(endpoint, **extra)
        handle = pools.start_pool(server.url, 1, tmp_path / "pool.log", queue_connection=queue_client(server.url),
                                  env={**env, "OPENAI_API_KEY": CANARY_KEY, "ANTHROPIC_API_KEY": CANARY_KEY})
        try:
            proc = subprocess.Popen([sys.executable, "-m", "agent", "ask", message], cwd=ROOT,
                                    env={**base_env, **env, "REDIS_URL": server.url, "AGENT_WORKERS": "0"},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
            try:
                out, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            worker_pids = pools.worker_pids(handle)
        finally:
            pools.stop_pool(handle, server.url)  # the worker flushes its spans as it exits
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), proc.pid, worker_pids


@pytest.mark.slow
def test_one_trace_runs_from_the_cli_through_a_worker_over_otlp_http(tmp_path, base_env, collector):
    code, out, err, cli_pid, worker_pids = traced_cli(tmp_path, base_env, collector.server.url, TWO_TOOLS)
    assert code == 0, err
    turn = wait_for(lambda: collector.named(tracing.TURN_SPAN), 15, "the worker's turn span")[0]
    submit = wait_for(lambda: collector.named(tracing.SUBMIT_SPAN), 15, "the CLI's submit span")[0]
    assert submit["resource"]["process.pid"] == cli_pid and submit["resource"]["service.name"] == "agent-test"
    assert turn["resource"]["process.pid"] in worker_pids
    assert turn["trace_id"] == submit["trace_id"] and turn["parent"] == submit["span_id"]
    children = [s for s in collector.spans if s["parent"] == turn["span_id"]]
    assert sorted(s["name"] for s in children) == sorted(
        ["queue_wait", "chat demo", "chat demo", "chat demo", "execute_tool calculator", "execute_tool current_time"])
    assert all(s["trace_id"] == submit["trace_id"] for s in children)
    tool = next(s for s in children if s["name"] == "execute_tool calculator")
    assert tool["attributes"]["gen_ai.tool.name"] == "calculator" and tool["attributes"]["gen_ai.tool.call.id"]
    assert turn["attributes"]["agent.clock.job_timeout_s"] == 120  # the CLI's own default clocks
    exported = b"".join(collector.raw)
    assert CANARY_KEY.encode() not in exported
    assert CONTENT_CANARY.encode() not in exported and b"17*23" not in exported  # no content by default


@pytest.mark.slow
def test_content_is_exported_only_when_asked_for(tmp_path, base_env, collector):
    code, *_ = traced_cli(tmp_path, base_env, collector.server.url, "What is 17*23?",
                          OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
    assert code == 0
    tool = wait_for(lambda: collector.named("execute_tool calculator"), 15, "the calculator's span")[0]
    assert tool["attributes"]["gen_ai.tool.call.arguments"] == '{"expression": "17*23"}'
    assert tool["attributes"]["gen_ai.tool.call.result"] == "391"
    assert CANARY_KEY.encode() not in b"".join(collector.raw)


@pytest.mark.slow
@pytest.mark.parametrize("collector_state", ["down", "hanging"])
def test_a_collector_that_is_down_or_hangs_costs_a_turn_nothing(tmp_path, base_env, collector_state):
    if collector_state == "down":
        server = LoopbackServer(lambda request: reply(200, {}))
        endpoint = server.url
        server.stop()  # a closed port: every export is refused
        hits = []
    else:
        hits = []
        server = LoopbackServer(lambda request: hits.append(time.monotonic()) or hang()).start()
        endpoint = server.url
    try:
        code, out, err, *_ = traced_cli(tmp_path, base_env, endpoint, "What is 6*7?")
    finally:
        server.stop()
    assert code == 0, err
    assert "42" in out
    assert "Traceback" not in err
    if collector_state == "hanging":
        assert hits, "no export was attempted"


# -- counts a provider reports, bounded where they are read -------------------------------------

# Token counts no provider means: past any real count (a trace's 64-bit integer included), negative, not
# whole, not a number. Each is dropped as unknown where the reply is read; the answer is kept.
ODD_COUNTS = [10**29, 1e29, 2**63, MAX_COUNT + 1, -1, 1.5, True, "12"]


def openai_plain(scripted, count):
    scripted.add(chat_reply("ok", usage={"prompt_tokens": count, "completion_tokens": 5}))


def openai_streamed(scripted, count):
    usage = {"prompt_tokens": count, "completion_tokens": 5}
    scripted.add(stream([*text_chunks("ok"), sse({"id": "c", "object": "chat.completion.chunk", "choices": [],
                                                "usage": usage}), DONE]))


def anthropic_plain(scripted, count):
    scripted.add(reply(200, {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}],
                           "usage": {"input_tokens": count, "output_tokens": 5}}))


def anthropic_streamed(scripted, count):
    scripted.add(stream([message_start(input_tokens=count), *text_block(0, "ok"), *message_end(output_tokens=5)]))


REPLY_FORMS = {openai_plain: "openai", openai_streamed: "openai", anthropic_plain: "anthropic",
               anthropic_streamed: "anthropic"}


@pytest.mark.parametrize("form", REPLY_FORMS, ids=lambda form: form.__name__)
def test_a_token_count_no_provider_means_is_dropped_where_the_reply_is_read(scripted, form):
    provider = (OpenAIProvider(scripted.url + "/v1", "m", None) if REPLY_FORMS[form] == "openai"
                else AnthropicProvider(scripted.url, "m", None))
    for count in [*ODD_COUNTS, 0, MAX_COUNT]:
        form(scripted, count)
        completion = provider.complete([{"role": "user", "content": "hi"}], [], SHORT)
        kept = count if count in (0, MAX_COUNT) else None
        assert (completion.content, completion.usage) == ("ok", Usage(kept, 5)), count


def test_a_stored_count_no_provider_means_reads_back_as_unknown(store):
    cid, tid = begin(store)
    odd = {"turn_id": tid, "kind": "model", "name": "demo", "started_at": 1.0, "ended_at": 2.0, "outcome": "ok"}
    store.publish(cid, tid, {"status": "running", "error": None}, new_steps=[
        {**odd, "index": 1, "usage": {"input_tokens": 10**29, "output_tokens": 7}, "partial_chars": 10**29},
        {**odd, "index": 2, "usage": {"input_tokens": -1, "output_tokens": 2**63}, "turns_not_sent": -10**30},
        {**odd, "index": 3, "usage": "lots"}])
    steps = store.read(cid)["steps"]
    assert steps[0]["usage"] == {"input_tokens": None, "output_tokens": 7} and steps[0]["partial_chars"] is None
    assert steps[1]["usage"] is None and steps[1]["turns_not_sent"] is None
    assert steps[2]["usage"] is None


def test_an_integer_past_64_bits_is_left_out_of_a_span_not_its_whole_export(collector, caplog):
    """Before the bound, a usage of 1e29 reached OTLP's 64-bit encoding, and every turn's export failed
    with a logged traceback; now the count is left out and the rest of the trace goes."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector.server.url}/v1/traces")))
    tracing.use_provider(provider)
    tid = new_id()
    step = {"turn_id": tid, "index": 1, "kind": "model", "name": "demo", "started_at": 1.7e9, "ended_at": 1.7e9 + 1,
            "outcome": "ok", "attempt": 10**29, "usage": {"input_tokens": 10**29, "output_tokens": 7}}
    summary = {"turn_id": tid, "status": "done", "error": None, "enqueued_at": 1.7e9, "ended_at": 1.7e9 + 2,
               "config": {"provider": "demo", "model": "demo", "job_timeout_s": 2**64}}
    try:
        tracing.export_turn(tracing._tracer, {"conversation_id": "c", "steps": [step], "turns": [summary]}, tid)
    finally:
        tracing.use_provider(None)
        provider.shutdown()
    chat = wait_for(lambda: collector.named("chat demo"), 15, "the model call's span")[0]
    assert chat["attributes"]["gen_ai.usage.output_tokens"] == 7
    assert "gen_ai.usage.input_tokens" not in chat["attributes"] and "agent.call.attempt" not in chat["attributes"]
    turn = wait_for(lambda: collector.named(tracing.TURN_SPAN), 15, "the turn's span")[0]
    assert "agent.clock.job_timeout_s" not in turn["attributes"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_retry_a_skipped_call_and_a_resume_are_events_on_the_turns_span():
    class Recorded:
        def __init__(self):
            self.events = []

        def add_event(self, name, attributes, timestamp):
            self.events.append((name, attributes, timestamp))

    turn, clocks = Recorded(), {"agent.clock.timeout_s": 3.0}
    assert tracing._step_event(turn, {"kind": "retry", "name": "model", "outcome": "timeout"}, clocks, 1, 2)
    assert tracing._step_event(turn, {"kind": "skip"}, clocks, 3, 4)
    assert tracing._step_event(turn, {"kind": "resume", "attempt": 1}, clocks, 5_000_000_000, 7_500_000_000)
    assert not tracing._step_event(turn, {"kind": "model"}, clocks, 8, 9)
    assert [(name, at) for name, _, at in turn.events] == [
        ("retry", 1), ("call_skipped", 3), ("resumed", 7_500_000_000)]
    assert turn.events[0][1]["agent.step.outcome"] == "timeout" and turn.events[2][1]["agent.resume.gap_s"] == 2.5
