"""Server-sent event streams for the scripted server, in both providers' formats.

    server.add(stream(openai_events(text_chunks("Hello there")), interval_s=0.05))

Each helper returns the events as bytes; `stream` (agent.runtime.loopback_server) sends them as
chunks, each its own write, `interval_s` apart, so a client reads them as they come.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def sse(data: Any, event: str | None = None) -> bytes:
    """One event; `data` is sent as JSON unless it is already text."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)  # raw UTF-8, as servers send
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()


# --- OpenAI Chat Completions -------------------------------------------------------------------


def chunk(delta: dict | None = None, *, finish_reason: str | None = None, **extra: Any) -> bytes:
    """One chat.completion.chunk event with one choice."""
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish_reason}
    return sse({"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [choice], **extra})


def text_chunks(*pieces: str) -> list[bytes]:
    """A role chunk, one content chunk per piece, a final chunk."""
    return [chunk({"role": "assistant", "content": ""}), *(chunk({"content": p}) for p in pieces),
            chunk(finish_reason="stop")]


def usage_chunk(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    return sse({"id": "chatcmpl-s", "object": "chat.completion.chunk", "choices": [], "usage": usage})


def call_delta(index: int, *, call_id: str | None = None, name: str | None = None, arguments: str = "") -> bytes:
    """A tool-call delta: the id and name in a call's first delta, arguments in any piece."""
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
        call["type"] = "function"
    if name is not None:
        call["function"]["name"] = name
    return chunk({"tool_calls": [call]})


# --- Anthropic Messages ------------------------------------------------------------------------


def message_start(input_tokens: int = 10, output_tokens: int = 1) -> bytes:
    message = {"id": "msg_s", "type": "message", "role": "assistant", "content": [], "model": "claude-test",
               "stop_reason": None, "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}
    return sse({"type": "message_start", "message": message}, "message_start")


def block_start(index: int, block: dict) -> bytes:
    return sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")


def block_delta(index: int, delta: dict) -> bytes:
    return sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")


def block_stop(index: int) -> bytes:
    return sse({"type": "content_block_stop", "index": index}, "content_block_stop")


def text_block(index: int, *pieces: str) -> list[bytes]:
    return [block_start(index, {"type": "text", "text": ""}),
            *(block_delta(index, {"type": "text_delta", "text": p}) for p in pieces), block_stop(index)]


def tool_block(index: int, tool_id: str, name: str, *json_pieces: str) -> list[bytes]:
    return [block_start(index, {"type": "tool_use", "id": tool_id, "name": name, "input": {}}),
            *(block_delta(index, {"type": "input_json_delta", "partial_json": p}) for p in json_pieces),
            block_stop(index)]


def message_end(output_tokens: int = 20, stop_reason: str = "end_turn") -> list[bytes]:
    delta = sse({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                 "usage": {"output_tokens": output_tokens}}, "message_delta")
    return [delta, sse({"type": "message_stop"}, "message_stop")]


PING = sse({"type": "ping"}, "ping")
