"""The chaos run's provider: the fault runner's (provider.py), drawing from the kinds of turn a fleet serves
rather than from every way a provider can misbehave: answers, replies streamed word by word (server-sent
events), tools, slow tools, side-effecting `ledger` batches, slow answers, and providers that hang.

A streamed reply is recorded as served just before its last event, as a whole reply is before its last byte,
so the checker (checks.py) holds it to the same promise: in the chat at most once, and in order.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from faults.provider import FaultProvider, RunLog

# Kinds of call and their weights (relative); a turn draws one per model call, seeded by its run.
CHAOS_CALLS: dict[str, int] = {
    "answer": 16,
    "streamed": 14,
    "tool_ok": 10,
    "tool_two": 4,
    "tool_slow": 5,
    "tool_ledger": 6,
    "slow_answer": 5,
    "hang": 3,
}
STREAM_WORDS = (6, 24)  # words in a streamed reply (at random, both included)
STREAM_GAP_S = (0.02, 0.12)  # seconds between two of its events


@dataclass(frozen=True)
class StreamedReply:
    """An OpenAI chat completion streamed as server-sent events, one word an event, `gap_s` apart."""

    events: tuple[bytes, ...]
    gap_s: float
    on_last_event: object = field(default=None, compare=False)

    def serve(self, exchange) -> None:
        exchange.close_after()  # a stream cut short leaves the connection unusable
        exchange.send_head(200, None, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        for index, event in enumerate(self.events):
            if index and exchange.wait(self.gap_s):
                return  # the client left (its call's time ran out) or the server stops
            if index == len(self.events) - 1 and self.on_last_event is not None:
                self.on_last_event()
            exchange.send_chunk(event)
        exchange.send_chunk(b"")


def _event(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "created": 0, "model": "chaos",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def streamed_reply(text: str, gap_s: float, on_last_event=None) -> StreamedReply:
    words = text.split(" ")
    events = [_event({"role": "assistant", "content": ""})]
    events += [_event({"content": (" " if i else "") + word}) for i, word in enumerate(words)]
    events += [_event({}, "stop"), b"data: [DONE]\n\n"]
    return StreamedReply(tuple(events), gap_s, on_last_event)


class ChaosProvider(FaultProvider):
    """FaultProvider with the chaos run's table of kinds, plus streamed replies."""

    def draw(self, model: str) -> tuple[str, RunLog, int]:
        run = self.run_log(model)
        with self._lock:
            kind = run.rng.choices(list(CHAOS_CALLS), weights=list(CHAOS_CALLS.values()))[0]
            run.calls += 1
            run.faults.append(kind)
            return kind, run, run.calls

    def action(self, kind: str, run: RunLog, model: str, number: int, request: dict | None = None):
        if kind != "streamed":
            return super().action(kind, run, model, number, request)
        rng = random.Random(f"{self.seed}:{model}:{number}")
        words = " ".join(f"w{i}" for i in range(rng.randint(*STREAM_WORDS)))
        message = {"role": "assistant", "content": f"answer {number} for {model}: {words}"}
        return streamed_reply(message["content"], rng.uniform(*STREAM_GAP_S),
                              on_last_event=lambda: run.served.append(message))
