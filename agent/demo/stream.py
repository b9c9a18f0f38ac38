"""A demo completion as OpenAI's server-sent events, its answer written a few characters at a time."""

from __future__ import annotations

import json

STREAM_TICK_S = 0.05  # seconds between events at most: small pieces, so the writing looks continuous
# Seconds the longest answer takes to write: a long one (a docs passage) is written faster, so that it
# fits the demo clocks' 8 s call cap with room for the latency before it.
MAX_WRITING_S = 4.0
DONE = b"data: [DONE]\n\n"


def event(data: dict) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def events(completion: dict, *, chars_per_s: float, include_usage: bool) -> tuple[list[bytes], float]:
    """The events of a Chat Completions stream for `completion`, and the seconds between them.

    The answer's text comes in pieces sized so that, one piece every interval, it is written at
    `chars_per_s` (0: in one piece), or in MAX_WRITING_S when that would take longer. A tool call
    comes as OpenAI sends one: its id and name first, its arguments in two halves."""
    base = {key: completion[key] for key in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict, finish_reason: str | None = None) -> bytes:
        return event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    text = message.get("content") or ""
    if chars_per_s > 0:
        chars_per_s = max(chars_per_s, len(text) / MAX_WRITING_S)
    piece_chars, interval_s = _pace(chars_per_s)
    pieces = -(-len(text) // piece_chars)
    if pieces * interval_s > MAX_WRITING_S:  # the last piece, rounded up, must not push it past the bound
        interval_s = MAX_WRITING_S / pieces
    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": text[start:start + piece_chars]}) for start in range(0, len(text), piece_chars)]
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": index, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": arguments[:half]}}
        parts.append(chunk({"tool_calls": [first]}))
        parts.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]}))
    parts.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        parts.append(event({**base, "choices": [], "usage": completion["usage"]}))
    parts.append(DONE)
    return parts, interval_s


def _pace(chars_per_s: float) -> tuple[int, float]:
    """(characters a piece, seconds between pieces) for a rate; 0: everything in one piece at once."""
    if chars_per_s <= 0:
        return 2**31, 0.0
    piece_chars = max(1, round(chars_per_s * STREAM_TICK_S))
    return piece_chars, piece_chars / chars_per_s
