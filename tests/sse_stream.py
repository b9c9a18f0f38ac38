"""A streamed OpenAI Chat Completions reply, as an action for the scripted server: text pieces as
server-sent events, a pause between groups of them, then the end (usage and `[DONE]`), a stall that
holds the connection open, or an error event.

    ScriptedServer([sse(["Seventeen", " times"], pause_s=0.1)])
    ScriptedServer([sse(["Three", " words", " then"], end=STALL)])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from agent.runtime.loopback_server import Exchange

DONE, STALL, ERROR = "done", "stall", "error"  # how the stream ends


def event(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n".encode()


def text_chunk(text: str) -> bytes:
    # As small as a chunk gets (about 60 bytes), so 100,000 of them stay under a provider's response limit.
    return event({"choices": [{"index": 0, "delta": {"content": text}}]})


@dataclass(frozen=True)
class SSEReply:
    pieces: list[str]
    pause_s: float = 0.0  # between groups of `per_write` pieces
    per_write: int = 1  # pieces sent in one write
    end: str = DONE
    usage: dict = field(default_factory=lambda: {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49})

    def serve(self, exchange: Exchange) -> None:
        exchange.close_after()
        groups = [b"".join(text_chunk(p) for p in self.pieces[i:i + self.per_write])
                  for i in range(0, len(self.pieces), self.per_write)]
        if self.end == DONE:
            groups.append(event({"id": "chatcmpl-sse", "object": "chat.completion.chunk",
                                 "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                          + event({"id": "chatcmpl-sse", "choices": [], "usage": self.usage}) + event("[DONE]"))
        elif self.end == ERROR:
            groups.append(event({"error": {"message": "the model server failed mid-stream", "type": "server_error"}}))
        # A stall announces more than it sends, so the client waits for the rest.
        length = sum(map(len, groups)) + (1_000_000 if self.end == STALL else 0)
        exchange.send_head(200, length, {"content-type": "text/event-stream"})
        for index, group in enumerate(groups):
            if index and self.pause_s and exchange.wait(self.pause_s):
                return
            exchange.write(group)
        if self.end == STALL:
            exchange.wait(None)


def sse(pieces: list[str], **options) -> SSEReply:
    return SSEReply(list(pieces), **options)
