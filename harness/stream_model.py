"""A scripted OpenAI-compatible model that streams its reply word by word, at a set pace, and notes
when each word left it: the page's figures time a word from here to the browser's screen.

Served by the project's loopback server; the page reaches it as `AGENT_PROVIDER=openai` with
`OPENAI_BASE_URL` on loopback (no key needed there). Each reply is the words `w0001 w0002 …`,
numbered across the whole run, so a word seen in the browser names exactly one send time.
A request that does not ask to stream gets the whole reply at once.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

from agent.runtime.loopback_server import Exchange, LoopbackServer, Request, reply

WORD_PREFIX = "w"


def word(n: int) -> str:
    return f"{WORD_PREFIX}{n:04d}"


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "created": 0, "model": "stream",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@dataclass
class Paced:
    """An SSE reply written one event at a time, `gap_s` apart; `on_sent(i)` just after event i is written."""

    events: list[bytes]
    gap_s: float
    on_sent: object = None

    def serve(self, exchange: Exchange) -> None:
        exchange.close_after()  # if the client leaves midway the connection cannot be reused
        exchange.send_head(200, sum(map(len, self.events)), {"Content-Type": "text/event-stream"})
        for index, event in enumerate(self.events):
            if index and exchange.wait(self.gap_s):
                return
            exchange.write(event)
            if self.on_sent is not None:
                self.on_sent(index)


@dataclass
class StreamModel:
    """Replies `words` words per call, `gap_s` apart. `sent` maps each word to when it left (epoch s)."""

    words: int = 30
    gap_s: float = 0.1
    sent: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    _next: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def next_word(self) -> int:
        """The number of the next reply's first word."""
        with self._lock:
            return self._next

    def reply_words(self) -> list[str]:
        with self._lock:
            first, self._next = self._next, self._next + self.words
            self.requests += 1
        return [word(n) for n in range(first, first + self.words)]

    def __call__(self, request: Request):
        if not request.path.rstrip("/").endswith("/chat/completions"):
            return reply(404, {"error": {"message": "not found"}})
        words = self.reply_words()
        if not (request.json or {}).get("stream"):
            for w in words:
                self.sent[w] = time.time()
            message = {"role": "assistant", "content": " ".join(words)}
            return reply(200, {"id": "chatcmpl-whole", "object": "chat.completion", "created": 0, "model": "stream",
                               "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": len(words), "total_tokens": 1}})
        events = [_chunk({"role": "assistant", "content": ""})]
        events += [_chunk({"content": (" " if i else "") + w}) for i, w in enumerate(words)]
        events += [_chunk({}, "stop"), b"data: [DONE]\n\n"]

        def on_sent(index: int) -> None:
            if 1 <= index <= len(words):
                self.sent[words[index - 1]] = time.time()

        return Paced(events, self.gap_s, on_sent)


def stream_model_server(model: StreamModel) -> LoopbackServer:
    """The model on loopback; its `url` + "/v1" is an OPENAI_BASE_URL."""
    return LoopbackServer(model, name="stream-model").start()


def page_env(server: LoopbackServer) -> dict[str, str]:
    """The page's environment for this model."""
    return {"AGENT_PROVIDER": "openai", "AGENT_MODEL": "stream", "OPENAI_BASE_URL": server.url + "/v1"}
