"""A model server on loopback that counts tokens as a tokenizer does and honours max_tokens, in OpenAI's and
Anthropic's shapes, streamed (server-sent events) or plain, as each request asks: what the budget's tests
and the fault runner check the fourth clock against.

    with TokenModel(replies, shape="openai", usage="asked") as model:
        config = FAST.with_changes(provider="openai", model="scripted", base_url=model.url + "/v1", ...)
        ...
        model.counted   # (input tokens it counted, output tokens it wrote, max_tokens asked) per request

`replies` are assistant messages in OpenAI's format, served in order (the last again when they run out; a
request without tools gets the next one without tool calls, as a model offered none answers), each cut at
the request's max_tokens as a model stops there. `usage` says when it reports what it counted:
"always" (a plain reply's usage; a stream's at its end), "asked" (a stream's only with
stream_options.include_usage, as OpenAI does), "never". Counting is agent/demo/tokens.py's: ceil(bytes / 4)
a pre-split piece, a few tokens a message; Anthropic's format adds its documented tool-use system prompt.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from agent.demo import tokens
from agent.runtime.loopback_server import Action, LoopbackServer, Request, delayed, reply, stream

USAGES = ("always", "asked", "never")


@dataclass(frozen=True)
class Counted:
    input_tokens: int
    output_tokens: int
    max_tokens: int | None
    streamed: bool


def _sse(data: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + json.dumps(data) + "\n\n").encode()


class TokenModel(LoopbackServer):
    """The server; `counted` lists what each request counted."""

    def __init__(self, replies: list[dict], *, shape: str = "openai", usage: str = "always",
                 interval_s: float = 0.0, delay_s: float = 0.0, plain: bool = False,
                 on_request: Callable[[int], None] | None = None, on_reply: Callable[[int], None] | None = None):
        assert shape in ("openai", "anthropic") and usage in USAGES
        self.replies, self.shape, self.usage, self.interval_s = list(replies), shape, usage, interval_s
        self.delay_s = delay_s  # seconds before each reply: a call a test can kill its worker in
        self.plain = plain  # answer plain JSON even to a request for a stream (the clients read it as plain)
        # Called with the request's number (0, 1, ...): once it is counted, and just before its reply's last byte
        # (where a test kills the worker that asked).
        self.on_request, self.on_reply = on_request, on_reply
        self._lock = threading.Lock()
        self.counted: list[Counted] = []
        self.bodies: list[dict] = []
        super().__init__(self._answer, name="token-model")
        self.start()

    def _answer(self, request: Request) -> Action:
        body = json.loads(request.body)
        with self._lock:
            index = len(self.counted)
            message = self.replies[min(index, len(self.replies) - 1)]
            if not body.get("tools") and message.get("tool_calls"):  # asked without tools: its answer instead
                message = next((m for m in self.replies[index:] if not m.get("tool_calls")), self.replies[-1])
            limit = body.get("max_completion_tokens") or body.get("max_tokens")
            if self.shape == "anthropic":
                input_tokens = anthropic_input_tokens(body)
            else:
                input_tokens = tokens.request_tokens(body["messages"], body.get("tools") or [])
            if limit is not None:
                message, _ = tokens.cut_reply(message, limit)
            output_tokens = tokens.reply_tokens(message)
            streamed = body.get("stream") is True and not self.plain
            self.counted.append(Counted(input_tokens, output_tokens, limit, streamed))
            self.bodies.append(body)
        if self.on_request is not None:
            self.on_request(index)
        if self.shape == "anthropic":
            action = self._anthropic(message, input_tokens, output_tokens, streamed)
        else:
            action = self._openai(body, message, input_tokens, output_tokens, streamed)
        if self.on_reply is not None:
            action = replace(action, on_last_byte=partial(self.on_reply, index))
        return delayed(self.delay_s, action) if self.delay_s else action

    def _openai(self, body: dict, message: dict, input_tokens: int, output_tokens: int, streamed: bool) -> Action:
        usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                 "total_tokens": input_tokens + output_tokens}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        if not streamed:
            data = {"id": "chatcmpl-t", "object": "chat.completion", "model": body.get("model"),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
            if self.usage != "never":
                data["usage"] = usage
            return reply(200, data)
        base = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "model": body.get("model")}
        parts = [_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
        for piece in tokens.pieces(message.get("content") or ""):
            parts.append(_sse({**base, "choices": [{"index": 0, "delta": {"content": piece}}]}))
        for index, call in enumerate(message.get("tool_calls") or []):
            delta = {"index": index, "id": call["id"], "type": "function", "function": call["function"]}
            parts.append(_sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]}))
        parts.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        options = body.get("stream_options") or {}
        if self.usage == "always" or (self.usage == "asked" and options.get("include_usage") is True):
            parts.append(_sse({**base, "choices": [], "usage": usage}))
        parts.append(b"data: [DONE]\n\n")
        return stream(parts, self.interval_s)

    def _anthropic(self, message: dict, input_tokens: int, output_tokens: int, streamed: bool) -> Action:
        blocks = []
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                           "input": json.loads(call["function"]["arguments"] or "{}")})
        stop_reason = "tool_use" if message.get("tool_calls") else "end_turn"
        reported = self.usage != "never"
        if not streamed:
            data = {"id": "msg_t", "type": "message", "role": "assistant", "model": "claude-test", "content": blocks,
                    "stop_reason": stop_reason}
            if reported:
                data["usage"] = {"input_tokens": input_tokens, "output_tokens": output_tokens}
            return reply(200, data)
        start = {"id": "msg_t", "type": "message", "role": "assistant", "content": [], "model": "claude-test",
                 "stop_reason": None}
        if reported:
            start["usage"] = {"input_tokens": input_tokens, "output_tokens": 1}
        parts = [_sse({"type": "message_start", "message": start}, "message_start")]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                parts.append(_sse({"type": "content_block_start", "index": index,
                                   "content_block": {"type": "text", "text": ""}}, "content_block_start"))
                for piece in tokens.pieces(block["text"]):
                    parts.append(_sse({"type": "content_block_delta", "index": index,
                                       "delta": {"type": "text_delta", "text": piece}}, "content_block_delta"))
            else:
                parts.append(_sse({"type": "content_block_start", "index": index,
                                   "content_block": {**block, "input": {}}}, "content_block_start"))
                parts.append(_sse({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}},
                                  "content_block_delta"))
            parts.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}}
        if reported:
            delta["usage"] = {"output_tokens": output_tokens}
        parts += [_sse(delta, "message_delta"), _sse({"type": "message_stop"}, "message_stop")]
        return stream(parts, self.interval_s)


def anthropic_input_tokens(body: dict) -> int:
    """A Messages request's input tokens: its system text, its messages' blocks, its tools and the hidden
    tool-use system prompt."""
    total = tokens.TOKENS_PER_REPLY
    system = body.get("system")
    if system:
        total += tokens.TOKENS_PER_MESSAGE + tokens.count(system if isinstance(system, str) else json.dumps(system))
    for message in body.get("messages") or []:
        total += tokens.TOKENS_PER_MESSAGE + tokens.count(str(message.get("role", "")))
        content = message.get("content")
        if isinstance(content, str):
            total += tokens.count(content)
            continue
        for block in content or []:
            if block.get("type") == "text":
                total += tokens.count(block.get("text", ""))
            elif block.get("type") == "tool_use":
                total += tokens.TOKENS_PER_TOOL_CALL + tokens.count(block.get("name", "")) + tokens.count(
                    json.dumps(block.get("input", {})))
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                total += tokens.count(inner if isinstance(inner, str) else json.dumps(inner))
    if body.get("tools"):
        total += tokens.count(json.dumps(body["tools"], separators=(",", ":"))) + tokens.ANTHROPIC_TOOLS_PREAMBLE
    return total
