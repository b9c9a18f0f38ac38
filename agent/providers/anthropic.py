"""The Anthropic Messages API with tools, streamed; the history stays in OpenAI chat format and is mapped per call."""

from __future__ import annotations

import re
import threading
from typing import Any

from agent import bounded_json
from agent.deadline import CallTimeout
from agent.providers import streaming
from agent.providers.base import Completion, TextListener, ToolCall, Usage
from agent.providers.http import decode_json, malformed, redact
from agent.providers.server_errors import raise_reported
from agent.providers.spec import ProviderSpec
from agent.providers.sse import DEFAULT_EVENT, Event
from agent.providers.streaming import StreamedModel
from agent.text.surrogates import scrub_json

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024  # tokens per response
MISSING_RESULT = "Error: the tool did not run (the turn ended first)"
_UNSAFE_ID = re.compile(r"[^a-zA-Z0-9_-]")
_IGNORED_BLOCKS = ("thinking", "redacted_thinking")  # reasoning the history does not keep
TOOL_CHOICE = {"type": "auto"}  # Anthropic's default, said as the OpenAI client says it, for servers that mimic it


class AnthropicProvider(StreamedModel):
    cuts_deep_replies = True  # a tool input nested too deeply is the tool layer's to refuse, not a bad reply

    def __init__(self, base_url: str, model: str, api_key: str | None, max_tokens: int = DEFAULT_MAX_TOKENS):
        super().__init__(base_url, model, api_key)
        self.max_tokens = max_tokens

    def complete(
        self,
        messages: list[dict],
        tools: list[dict],
        timeout: CallTimeout,
        stop: threading.Event | None = None,
        on_text: TextListener | None = None,
        stream: bool = True,
        max_tokens: int | None = None,
    ) -> Completion:
        system, mapped = to_anthropic_messages(messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens or self.max_tokens, "messages": mapped}
        if system:
            body["system"] = system
        if tools:  # without tools, no tool_choice: Anthropic refuses one alone
            body["tools"] = to_anthropic_tools(tools)
            body["tool_choice"] = TOOL_CHOICE
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION,
                   "accept": "text/event-stream, application/json"}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return self._call("/v1/messages", headers=headers, body=body, stream_fields={"stream": True},
                          timeout=timeout, stop=stop, on_text=on_text, stream=stream, assembler=MessageStream,
                          parse=parse_message)


class MessageStream:
    """The Messages event stream -> one Completion: `message_start`, then per content block
    `content_block_start`, its `text_delta`s or `input_json_delta`s and `content_block_stop`, then
    `message_delta` (usage) and `message_stop` (the end); `ping` and unknown events are skipped, as
    Anthropic's versioning asks; an `error` event is the error it names. Validated like parse_message."""

    def __init__(self, on_text: TextListener | None, secret: str | None):
        self._secret = secret
        self._text = streaming.TextRelay(on_text, secret)
        self._blocks: dict[int, _Block] = {}
        self._started = False
        self._stopped = False
        self._input_tokens: int | None = None
        self._output_tokens: int | None = None
        self._cached_tokens: int | None = None

    def take(self, events: list[Event]) -> bool:
        for event in events:
            if self._stopped:
                break
            if event.stray:
                streaming.raise_if_reported(event.data, self._secret)
            else:
                self._event(event)
        self._text.flush()
        return self._stopped

    def result(self) -> Completion:
        if not self._stopped:
            calls_begun = any(block.kind == "tool_use" for block in self._blocks.values())
            raise streaming.cut_off("message_stop", nothing_arrived=not calls_begun and not self._text.arrived)
        calls = [block.tool_call(self._secret) for _, block in sorted(self._blocks.items()) if block.kind == "tool_use"]
        content: str | None = self._text.finish()
        if not content and calls:
            content = None
        usage = Usage(self._input_tokens, self._output_tokens, self._cached_tokens)
        return Completion(content=content, tool_calls=calls, usage=None if usage == Usage() else usage, streamed=True)

    def _event(self, event: Event) -> None:
        data = decode_json(event.data, secret=self._secret, cut=True)  # a tool input's deep parts: see _Block
        if not isinstance(data, dict):
            raise malformed(f"the {event.name} event is not a JSON object")
        kind = data.get("type") if event.name == DEFAULT_EVENT else event.name
        if kind == "error":
            raise_reported(data, secret=self._secret, where="in its stream")
        elif kind == "message_start":
            message = data.get("message")
            if not isinstance(message, dict) or message.get("type", "message") != "message":
                raise malformed("message_start carries no message object")
            if message.get("role", "assistant") != "assistant":
                raise malformed("the message role is not 'assistant'")
            self._count(message.get("usage"))
            self._started = True
        elif kind == "content_block_start":
            self._block_start(data)
        elif kind == "content_block_delta":
            self._block_delta(data)
        elif kind == "content_block_stop":
            self._block(data).closed = True
        elif kind == "message_delta":
            self._count(data.get("usage"))
        elif kind == "message_stop":
            if not self._started:
                raise malformed("message_stop came without a message_start")
            self._stopped = True
        # ping, and event types added after this client was written, carry nothing it keeps

    def _count(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        # message_delta's output count is the running total, so the latest one wins.
        counted = streaming.usage_of(usage, "input_tokens", "output_tokens") or Usage()
        self._input_tokens = self._input_tokens if counted.input_tokens is None else counted.input_tokens
        self._output_tokens = self._output_tokens if counted.output_tokens is None else counted.output_tokens
        cached = counted.cached_input_tokens
        self._cached_tokens = self._cached_tokens if cached is None else cached

    def _index(self, data: dict) -> int:
        index = data.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise malformed("a content block event's 'index' is not a whole number")
        return index

    def _block(self, data: dict) -> _Block:
        block = self._blocks.get(self._index(data))
        if block is None or block.closed:
            raise malformed("a content block event names a block that is not open")
        return block

    def _block_start(self, data: dict) -> None:
        index = self._index(data)
        if index in self._blocks:
            raise malformed(f"content block {index} started twice")
        raw = data.get("content_block")
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "text":
            if not isinstance(raw.get("text", ""), str):
                raise malformed(f"content[{index}].text is not text")
            self._text.add(raw.get("text", ""))
            self._blocks[index] = _Block("text")
        elif kind == "tool_use":
            if not isinstance(raw.get("id"), str) or not isinstance(raw.get("name"), str) or not raw["name"]:
                raise malformed(f"content[{index}] has no tool id or name")
            if not isinstance(raw.get("input", {}), dict):
                raise malformed(f"content[{index}].input is not an object")
            self._blocks[index] = _Block("tool_use", raw["id"], raw["name"], raw.get("input", {}))
        elif kind in _IGNORED_BLOCKS:
            self._blocks[index] = _Block(kind)
        else:
            raise malformed(f"content[{index}] has an unexpected type")

    def _block_delta(self, data: dict) -> None:
        block = self._block(data)
        delta = data.get("delta")
        kind = delta.get("type") if isinstance(delta, dict) else None
        if kind == "text_delta" and block.kind == "text":
            if not isinstance(delta.get("text"), str):
                raise malformed("a text_delta's text is not text")
            self._text.add(delta["text"])
        elif kind == "input_json_delta" and block.kind == "tool_use":
            if not isinstance(delta.get("partial_json"), str):
                raise malformed("an input_json_delta's partial_json is not text")
            block.json_parts.append(delta["partial_json"])
        elif block.kind in _IGNORED_BLOCKS:
            return  # thinking_delta, signature_delta: reasoning the history does not keep
        else:
            raise malformed(f"a {kind!r} delta does not fit a {block.kind} block")


class _Block:
    """One content block as it streams in."""

    def __init__(self, kind: str, tool_id: str = "", name: str = "", tool_input: dict | None = None):
        self.kind = kind
        self.tool_id = tool_id
        self.name = name
        self.tool_input = tool_input or {}
        self.json_parts: list[str] = []
        self.closed = False

    def tool_call(self, secret: str | None) -> ToolCall:
        text = "".join(self.json_parts)
        tool_input: Any = self.tool_input
        if text.strip():
            try:  # parts nested too deeply are kept as their text: the tool layer refuses them by name
                tool_input = bounded_json.loads(redact(text, secret), cut=True)
            except ValueError as exc:
                raise malformed(f"the input of tool call {self.name!r} is not JSON") from exc
        if not isinstance(tool_input, dict):
            raise malformed(f"the input of tool call {self.name!r} is not an object")
        return ToolCall(id=redact(self.tool_id, secret), name=redact(self.name, secret),
                        arguments=redact(bounded_json.dumps(scrub_json(tool_input)), secret))


ANTHROPIC = ProviderSpec(name="anthropic", client=AnthropicProvider, default_model="claude-sonnet-4-5",
                         url_variable="ANTHROPIC_BASE_URL", default_url="https://api.anthropic.com",
                         key_variable="ANTHROPIC_API_KEY")


def to_anthropic_tools(tools: list[dict]) -> list[dict]:
    """OpenAI function schemas -> Anthropic tool definitions."""
    mapped = []
    for tool in tools:
        function = tool.get("function", tool)
        mapped.append(
            {
                "name": function["name"],
                "description": function.get("description") or "",
                "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
            }
        )
    return mapped


def to_anthropic_messages(messages: list[dict]) -> tuple[str, list[dict]]:
    """OpenAI-format history -> (system text, alternating user/assistant messages with content blocks)."""
    system_parts: list[str] = []
    turns: list[dict] = []

    def add(role: str, blocks: list[dict]) -> None:
        if not blocks:
            return  # Anthropic refuses empty content
        if turns and turns[-1]["role"] == role:  # Anthropic requires strict alternation
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for message in messages:
        role = message.get("role")
        content = _text(message.get("content"))
        if role == "system":
            if content:
                system_parts.append(content)
        elif role == "user":
            add("user", [{"type": "text", "text": content}] if content else [])
        elif role == "assistant":
            blocks = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": _safe_id(call.get("id", "")),
                        "name": function.get("name", ""),
                        "input": _arguments(function.get("arguments")),
                    }
                )
            add("assistant", blocks)
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": _safe_id(message.get("tool_call_id", "")),
                "content": content,
            }
            if content.startswith("Error:"):
                result["is_error"] = True
            add("user", [result])
    return "\n\n".join(system_parts), _pair_tool_results(turns)


def _pair_tool_results(turns: list[dict]) -> list[dict]:
    """Every tool_use gets a tool_result in the next user message, first in it; orphan results become text.

    A turn that ended between a model call and its tool runs leaves tool calls without results,
    which Anthropic refuses; the next turn must still be sendable.
    """
    fixed: list[dict] = []
    expected: list[str] = []
    for turn in turns:
        if turn["role"] == "assistant":
            if expected:  # the previous tool calls never got a user message at all
                fixed.append({"role": "user", "content": [_missing(i) for i in expected]})
            fixed.append(turn)
            expected = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
            continue
        results, others = [], []
        for block in turn["content"]:
            if block["type"] == "tool_result" and block["tool_use_id"] in expected:
                results.append(block)
            elif block["type"] == "tool_result":
                others.append({"type": "text", "text": f"Tool result: {block['content']}"})
            else:
                others.append(block)
        answered = {b["tool_use_id"] for b in results}
        results += [_missing(i) for i in expected if i not in answered]
        fixed.append({"role": "user", "content": results + others})
        expected = []
    if expected:
        fixed.append({"role": "user", "content": [_missing(i) for i in expected]})
    return fixed


def _missing(tool_use_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": MISSING_RESULT, "is_error": True}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _arguments(arguments: Any) -> dict:
    try:  # arguments nested too deeply went back to the model as a tool error; sent here as none
        value = bounded_json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _safe_id(tool_id: Any) -> str:
    # Anthropic accepts ids matching [a-zA-Z0-9_-]+; other servers' ids may not.
    return _UNSAFE_ID.sub("_", str(tool_id)) or "call"


def parse_message(data: Any) -> Completion:
    """Validate a Messages API response strictly; anything unexpected is "malformed", never a crash."""
    if not isinstance(data, dict) or data.get("type") != "message":
        raise malformed("the body is not a message object")
    if data.get("role", "assistant") != "assistant":
        raise malformed("the message role is not 'assistant'")
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise malformed("'content' is not a list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(blocks):
        where = f"content[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise malformed(f"{where}.text is not text")
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not block["name"]:
                raise malformed(f"{where} has no tool id or name")
            if not isinstance(block.get("input"), dict):
                raise malformed(f"{where}.input is not an object")
            calls.append(ToolCall(id=block["id"], name=block["name"], arguments=bounded_json.dumps(block["input"])))
        elif kind in _IGNORED_BLOCKS:
            continue
        else:
            raise malformed(f"{where} has an unexpected type")
    content: str | None = "".join(texts)
    if not content and calls:
        content = None
    return Completion(content=content, tool_calls=calls,
                      usage=streaming.usage_of(data.get("usage"), "input_tokens", "output_tokens"))
