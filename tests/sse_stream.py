"""Streamed OpenAI replies as the live-text tests need them, built on the scripted server's `stream`
action and tests/sse_server.py: text pieces, a pause between groups of them, then the end (usage
and `[DONE]`), a stall that holds the connection open, or an error event.

    ScriptedServer([reply_stream(["Seventeen", " times"], pause_s=0.1)])
    ScriptedServer([reply_stream(["Three", " words", " then"], end=STALL)])
"""

from __future__ import annotations

from agent.runtime.loopback_server import Stream, stream
from tests.sse_server import DONE, chunk, sse, usage_chunk

END_DONE, STALL, ERROR = "done", "stall", "error"  # how the stream ends
USAGE = (42, 7)  # the input and output tokens every finished stream reports


def text_chunk(text: str) -> bytes:
    # As small as a chunk gets (about 60 bytes), so 100,000 of them stay under a provider's response limit.
    return sse({"choices": [{"index": 0, "delta": {"content": text}}]})


def reply_stream(pieces: list[str], *, pause_s: float = 0.0, per_write: int = 1, end: str = END_DONE) -> Stream:
    """`pieces` as text chunks, `per_write` of them in each write, `pause_s` between writes."""
    parts = [b"".join(map(text_chunk, pieces[i:i + per_write])) for i in range(0, len(pieces), per_write)]
    if end == END_DONE:
        parts.append(chunk(finish_reason="stop") + usage_chunk(*USAGE) + DONE)
    elif end == ERROR:
        parts.append(sse({"error": {"message": "the model server failed mid-stream", "type": "server_error"}}))
    return stream(parts, pause_s, stall=end == STALL)
