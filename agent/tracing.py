"""OpenTelemetry traces of turns: off unless the standard OTLP variables are set.

One trace per turn. The submitter (page or CLI) opens it with a short `submit_turn` span and stores
its W3C `traceparent` with the turn (`TurnDoc.trace_parent`), so whoever writes the turn's ending
continues the same trace: the worker, or the failure callback or a front end when the worker was
lost. The spans are built from the turn's recorded steps once the ending is written, with the
steps' own times: nothing is added while the turn runs (with tracing off, not even this module's
SDK imports), a collector that is down or slow can only lose spans, never delay a write, and a
turn whose worker was killed is traced too, from what Redis holds.

The span tree follows the OpenTelemetry GenAI semantic conventions:

    submit_turn                          (the submitter's process)
      invoke_agent agent-clocks          enqueued -> ended; the clocks; an ending other than done is an error
        queue_wait                       enqueued -> a worker started it
        chat {model}                     one per model call: provider, model, tokens, its timeout and budget
        execute_tool {name}              one per tool run: name, call id, MCP server, its timeout and budget
      events on invoke_agent: retry, call_skipped, stop, ending

Contents (messages, tool arguments and results, error details) are recorded only when
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is true; an API key never is (keys never reach
the state these spans are built from).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping

from agent.contract import Kind, Outcome, State, Status

log = logging.getLogger(__name__)

SERVICE_NAME = "agent-clocks"  # OTEL_SERVICE_NAME's default
AGENT_NAME = "agent-clocks"  # gen_ai.agent.name
CONTENT_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# With sign-in, a turn carries its owner's id (`user.id`, a digest); their email only when this is true.
OWNER_EMAIL_VARIABLE = "AGENT_TRACE_OWNER_EMAIL"
EXPORT_TIMEOUT_S = 5.0  # seconds one export may take, unless OTEL_EXPORTER_OTLP_TIMEOUT says otherwise
SHUTDOWN_WAIT_S = 1.0  # seconds a process waits at exit for its last spans to leave
MAX_QUEUED_SPANS = 2048  # spans waiting for export; past this a slow collector loses spans, never time
CONTENT_CHARS = 2000  # characters of one recorded content attribute
SUBMIT_SPAN = "submit_turn"
TURN_SPAN = f"invoke_agent {AGENT_NAME}"
QUEUE_SPAN = "queue_wait"
MCP_SEPARATOR = "__"  # an MCP tool is offered as <server>__<tool> (agent/tools/mcp.py)
OTLP_INT_RANGE = range(-(2**63), 2**63)  # OTLP carries an integer attribute as 64 bits

FORKED_FLUSH_S = 1.0  # seconds a forked work horse waits for its turn's spans to leave before it exits

_lock = threading.Lock()
_tracer = None  # the process's tracer once set up; None while tracing is off
_tracer_pid = None  # the process that set it up: a forked work horse exits without running atexit
_provider = None  # its TracerProvider


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Tracing is on when an OTLP endpoint is named and the SDK is not disabled."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def capture_content(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(CONTENT_VARIABLE, "").strip().lower() == "true"


def owner_email_on(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(OWNER_EMAIL_VARIABLE, "").strip().lower() == "true"


def setup(env: Mapping[str, str] | None = None):
    """Once per process: the OTLP/HTTP exporter behind a bounded batch; None when tracing is off."""
    global _tracer, _tracer_pid, _provider
    if not enabled(env):
        return None
    with _lock:
        if _tracer is None:
            _provider = _make_provider(os.environ if env is None else env)
            _tracer = _provider.get_tracer("agent.tracing")
            _tracer_pid = os.getpid()
        return _tracer


def use_provider(provider) -> None:
    """Tests: send spans to `provider` (an SDK TracerProvider over an in-memory exporter); None: off."""
    global _tracer, _tracer_pid, _provider
    _provider = provider
    _tracer = provider.get_tracer("agent.tracing") if provider is not None else None
    _tracer_pid = os.getpid()


def _make_provider(env: Mapping[str, str]):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    timeout_s = None if env.get("OTEL_EXPORTER_OTLP_TIMEOUT") else EXPORT_TIMEOUT_S
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create itself; the pid tells
    # the page's or CLI's spans from a worker's within one trace.
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME,
                                "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=timeout_s),
                                                   max_queue_size=MAX_QUEUED_SPANS))
    atexit.register(_shutdown, provider)
    return provider


def _shutdown(provider) -> None:
    """Flush what is queued, but never hold the process's exit for a collector that does not answer."""
    done = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    done.start()
    done.join(SHUTDOWN_WAIT_S)


# -- the submitter -------------------------------------------------------------------------------


def submit_span(conversation_id: str, turn_id: str, config: dict) -> str | None:
    """The trace's first span, in the page's or CLI's process; its traceparent, to store with the turn."""
    tracer = _tracer
    if tracer is None:
        return None
    from opentelemetry.propagate import inject
    from opentelemetry.trace import SpanKind, set_span_in_context

    with tracer.start_as_current_span(SUBMIT_SPAN, kind=SpanKind.PRODUCER) as span:
        span.set_attributes({"gen_ai.conversation.id": conversation_id, "agent.turn.id": turn_id,
                             "messaging.system": "rq", "gen_ai.request.model": str(config.get("model") or ""),
                             "gen_ai.provider.name": str(config.get("provider") or "")})
        carrier: dict[str, str] = {}
        inject(carrier, context=set_span_in_context(span))
    return carrier.get("traceparent")


def trace_id(trace_parent: str | None) -> str | None:
    """The trace id of a W3C traceparent (`00-<trace id>-<span id>-<flags>`), for the page to show."""
    if not isinstance(trace_parent, str):
        return None
    parts = trace_parent.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and all(c in "0123456789abcdef" for c in parts[1]):
        return parts[1]
    return None


# -- the ending ----------------------------------------------------------------------------------


def turn_ended(store, conversation_id: str, turn_id: str) -> None:
    """After a turn's final write: its spans, from what Redis holds. Never raises: tracing must not
    cost a turn anything, least of all its ending."""
    tracer = _tracer
    if tracer is None:
        return
    try:
        state = store.read(conversation_id)
        if state is not None:
            owner = state.get("owner")
            export_turn(tracer, state, turn_id,
                        owner_email=store.owner_email(owner) if owner and owner_email_on() else None)
        if os.getpid() != _tracer_pid and _provider is not None:
            _provider.force_flush(int(FORKED_FLUSH_S * 1000))
    except Exception:  # noqa: BLE001 - a trace lost is logged, a turn is never failed for it
        log.warning("turn %s: its trace could not be built", turn_id, exc_info=True)


def export_turn(tracer, state: State, turn_id: str, owner_email: str | None = None) -> None:
    """The turn's span tree, built from its summary and steps with their own times; `owner_email` only where
    AGENT_TRACE_OWNER_EMAIL asks for it."""
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind, StatusCode, set_span_in_context
    from opentelemetry.trace import Status as SpanStatus

    summary = next((t for t in state.get("turns") or [] if t.get("turn_id") == turn_id), None)
    if summary is None or summary.get("ended_at") is None:
        return
    steps = [s for s in state.get("steps") or [] if isinstance(s, dict) and s.get("turn_id") == turn_id]
    config = summary.get("config") or {}
    content = capture_content()
    parent = extract({"traceparent": summary.get("trace_parent") or ""})
    enqueued_at = summary.get("enqueued_at") or summary.get("started_at") or summary["ended_at"]
    started_at = summary.get("started_at")
    status = summary.get("status")
    error = summary.get("error") or {}
    branch = summary.get("branch") if isinstance(summary.get("branch"), dict) else {}

    turn = tracer.start_span(TURN_SPAN, context=parent, kind=SpanKind.INTERNAL, start_time=_ns(enqueued_at))
    turn.set_attributes(_exportable({
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": AGENT_NAME,
        "gen_ai.conversation.id": state.get("conversation_id"),
        "user.id": state.get("owner"),  # a signed-in person's id (a digest of issuer and subject)
        "user.email": owner_email,
        "gen_ai.provider.name": config.get("provider"),
        "gen_ai.request.model": config.get("model"),
        "agent.turn.id": turn_id,
        "agent.turn.status": status,
        # where it is in the conversation's tree: its parent turn, and whether it answers a turn again or edits one
        "agent.turn.parent_id": _text(summary.get("parent_turn_id")),
        "agent.turn.branch": _text(branch.get("kind")),
        "agent.turn.branch_of": _text(branch.get("of")),
        "agent.turn.safeguards": config.get("safeguards") is not False,
        "agent.clock.job_timeout_s": config.get("job_timeout_s"),
        "agent.clock.deadline_margin_s": config.get("deadline_margin_s"),
        "agent.clock.call_timeout_cap_s": config.get("call_timeout_cap_s"),
        "agent.clock.min_call_s": config.get("min_call_s"),
        "agent.clock.started_at": started_at,
        "agent.clock.deadline_at": summary.get("deadline_at"),
        "agent.clock.job_timeout_at": summary.get("job_timeout_at"),
        **_spend_attributes(summary.get("spend")),
    }))
    context = set_span_in_context(turn)
    if started_at:
        tracer.start_span(QUEUE_SPAN, context=context, start_time=_ns(enqueued_at)).end(end_time=_ns(started_at))
    for step in steps:
        _step_span(tracer, turn, context, step, config, content)
    ending = _exportable({"agent.turn.status": status, "error.type": error.get("kind"),
                         "agent.ending.message": _cut(error.get("message")) if content else None})
    turn.add_event("ending", ending, timestamp=_ns(summary["ended_at"]))
    if status == Status.DONE:
        turn.set_status(SpanStatus(StatusCode.OK))
    else:
        turn.set_attribute("error.type", error.get("kind") or status or "unknown")
        turn.set_status(SpanStatus(StatusCode.ERROR, f"the turn ended {status}"))
    turn.end(end_time=_ns(summary["ended_at"]))


def _spend_attributes(spend) -> dict:
    """The fourth clock on a turn's span: what it spent (tokens, US dollars) against its budget."""
    if not isinstance(spend, dict):
        return {}
    return {"agent.cost.tokens": spend.get("tokens"), "agent.cost.usd": spend.get("usd"),
            "agent.budget.tokens": spend.get("budget_tokens"), "agent.budget.usd": spend.get("budget_usd"),
            "agent.budget.reserve_usd": spend.get("reserve_usd"),
            "agent.budget.checked": spend.get("checked")}


def _step_span(tracer, turn, context, step: dict, config: dict, content: bool) -> None:
    from opentelemetry.trace import SpanKind, StatusCode
    from opentelemetry.trace import Status as SpanStatus

    kind, outcome = step.get("kind"), step.get("outcome")
    started, ended = _ns(step.get("started_at")), _ns(step.get("ended_at"))
    clocks = _exportable({"agent.clock.timeout_s": step.get("timeout_s"),
                         "agent.clock.remaining_s": step.get("remaining_s")})
    if _step_event(turn, step, clocks, started, ended):
        return
    if kind == Kind.APPROVAL:
        _approval_span(tracer, turn, context, step)
        return
    if kind == Kind.MODEL:
        model = config.get("model") or str(step.get("name"))
        span = tracer.start_span(f"chat {model}", context=context, kind=SpanKind.CLIENT, start_time=started)
        usage = step.get("usage") if isinstance(step.get("usage"), dict) else {}
        span.set_attributes(_exportable({
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": config.get("provider"),
            "gen_ai.request.model": model,
            "gen_ai.response.model": step.get("response_model") or model,
            "gen_ai.usage.input_tokens": usage.get("input_tokens"),
            "gen_ai.usage.output_tokens": usage.get("output_tokens"),
            "gen_ai.usage.cache_read.input_tokens": usage.get("cached_input_tokens"),
            "gen_ai.request.max_tokens": step.get("max_tokens"),
            "gen_ai.response.finish_reasons": _finish_reasons(step),
            "agent.call.cost_usd": step.get("cost_usd"),
            "agent.call.cost_tokens": step.get("cost_tokens"),
            "agent.call.cost_worst_case": step.get("cost_worst"),
            "agent.call.input_bound": step.get("input_bound"),
            "agent.call.attempt": step.get("attempt"),
            "agent.call.last_call": step.get("last_call"),
            **clocks,
        }))
    elif kind == Kind.TOOL:
        name = str(step.get("name"))
        span = tracer.start_span(f"execute_tool {name}", context=context, kind=SpanKind.INTERNAL, start_time=started)
        server, _, _ = name.partition(MCP_SEPARATOR) if MCP_SEPARATOR in name else ("", "", "")
        span.set_attributes(_exportable({
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": step.get("call_id"),
            "gen_ai.tool.type": "extension" if server else "function",
            "mcp.server.name": server or None,
            "gen_ai.tool.call.arguments": _cut(step.get("arguments")) if content else None,
            "gen_ai.tool.call.result": _cut(step.get("result")) if content else None,
            **clocks,
        }))
    else:
        return
    span.set_attribute("agent.step.outcome", str(outcome))
    if outcome == Outcome.STOPPED:
        turn.add_event("stop", {"agent.step.name": str(step.get("name"))}, timestamp=ended)
    if outcome in (Outcome.OK, None):
        span.set_status(SpanStatus(StatusCode.OK))
    else:
        span.set_attribute("error.type", str(outcome))
        span.set_status(SpanStatus(StatusCode.ERROR, _cut(step.get("detail")) if content else str(outcome)))
    span.end(end_time=ended)


def _step_event(turn, step: dict, clocks: dict, started, ended) -> bool:
    """A retry, a skipped call or a resume, as an event on the turn's span; False for any other step."""
    kind = step.get("kind")
    if kind == Kind.RETRY:
        turn.add_event("retry", {**clocks, "agent.step.name": str(step.get("name")),
                                 "agent.step.outcome": step.get("outcome")}, timestamp=started)
    elif kind == Kind.SKIP:
        turn.add_event("call_skipped", clocks, timestamp=started)
    elif kind == Kind.RESUME:  # the gap from the lost worker's last write to the job that resumed the turn
        turn.add_event("resumed", {**clocks, "agent.resume.attempt": step.get("attempt") or 0,
                                   "agent.resume.gap_s": round((ended - started) / 1e9, 3)}, timestamp=ended)
    else:
        return False
    return True


def _approval_span(tracer, turn, context, step: dict) -> None:
    """The wait for a person, between two jobs' clocks: approved, denied or expired (not an error)."""
    from opentelemetry.trace import Status as SpanStatus
    from opentelemetry.trace import StatusCode

    outcome, ended = step.get("outcome"), _ns(step.get("ended_at"))
    span = tracer.start_span(f"await_approval {step.get('name')}", context=context,
                             start_time=_ns(step.get("started_at")))
    span.set_attributes(_exportable({"gen_ai.tool.name": str(step.get("name")),
                                     "gen_ai.tool.call.id": step.get("call_id"),
                                     "agent.approval.answer": str(outcome),
                                     "agent.approval.answered_by": _answered_where(step.get("answered_by"))}))
    turn.add_event(f"approval_{outcome}", {"gen_ai.tool.name": str(step.get("name"))}, timestamp=ended)
    span.set_status(SpanStatus(StatusCode.OK))
    span.end(end_time=ended)


def _answered_where(by) -> str | None:
    """Where an answer came from, without who gave it: a signed-in person's name (or email) stays out of traces."""
    if not isinstance(by, str):
        return None
    return "on the page" if by.endswith("on the page") else by


def _finish_reasons(step: dict) -> list[str] | None:
    if step.get("outcome") != Outcome.OK:
        return None
    return ["tool_calls"] if step.get("tool_calls") else ["stop"]


def _ns(seconds) -> int | None:
    return int(float(seconds) * 1e9) if isinstance(seconds, (int, float)) else None


def _cut(text) -> str | None:
    if not isinstance(text, str):
        return None
    return text if len(text) <= CONTENT_CHARS else text[: CONTENT_CHARS - 1] + "…"


def _text(value) -> str | None:
    """A stored id or word as an attribute's text (None: left out)."""
    return None if value is None else str(value)


def _exportable(attributes: dict) -> dict:
    """What OpenTelemetry can carry: an unknown value (None) is left out, and so is an integer past 64
    bits, which would fail the export of every span in its batch, not only its own attribute."""
    return {key: value for key, value in attributes.items()
            if value is not None and (not isinstance(value, int) or value in OTLP_INT_RANGE)}
