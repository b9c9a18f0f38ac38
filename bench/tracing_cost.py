"""What tracing costs a turn: the same four-call turn with tracing off and on, side by side."""

from __future__ import annotations

import os
import statistics
import time

from agent import tracing
from agent.queue import new_id, submit_turn
from agent.runtime.loopback_server import LoopbackServer, reply
from agent.settings import TurnConfig
from bench.lab import THREE_TOOL_MESSAGE, Lab, NoQueue, PoolProcess
from harness.stats import summary


def _turn_s(lab: Lab, config: TurnConfig) -> tuple[float, str]:
    """submit_turn's writes (and, traced, its submit span), then the job function, in this process."""
    from agent.turn import run_turn

    cid = new_id()
    begun = time.perf_counter()
    turn_id = submit_turn(lab.store, NoQueue(), cid, THREE_TOOL_MESSAGE, config)
    run_turn(cid, turn_id)  # with tracing on, this includes building and queueing the turn's spans
    return time.perf_counter() - begun, cid


def _provider(endpoint: str):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=5)))
    return provider


def tracing_overhead(lab: Lab, pool: PoolProcess, pairs: int, latency_s: float) -> dict:
    """`pairs` pairs of the three-tool turn (4 model calls at `latency_s`), tracing off then on, each pair
    back to back in this process against a loopback OTLP/HTTP collector; ratio = on / off per pair."""
    os.environ["REDIS_URL"] = lab.url
    os.environ["AGENT_DEMO_URL"] = pool.demo_url
    config = TurnConfig(model=f"demo@{latency_s:g}")
    received = []
    collector = LoopbackServer(lambda request: received.append(len(request.body)) or reply(200, body=b"")).start()
    provider = _provider(collector.url)
    off, on, ratios, build_ms = [], [], [], []
    try:
        _turn_s(lab, TurnConfig(model="demo@0"))  # warm: imports, the HTTP session
        for _ in range(pairs):
            tracing.use_provider(None)
            off_s, _ = _turn_s(lab, config)
            tracing.use_provider(provider)
            on_s, cid = _turn_s(lab, config)
            state = lab.store.read(cid)
            started = time.perf_counter()
            tracing.export_turn(tracing._tracer, state, state["turn_id"])  # the part tracing adds, alone
            build_ms.append((time.perf_counter() - started) * 1000)
            off.append(off_s)
            on.append(on_s)
            ratios.append(on_s / off_s)
        provider.force_flush(5000)
    finally:
        tracing.use_provider(None)
        provider.shutdown()
        collector.stop()
    return {
        "ratio": round(statistics.median(ratios), 4),
        "ratios": [round(r, 4) for r in ratios],
        "off_s": summary(off, 1, 3),
        "on_s": summary(on, 1, 3),
        "spans_build_ms": summary(build_ms, 1, 2),
        "export_requests": len(received),
    }
