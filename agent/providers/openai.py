"""Chat Completions with tools, for any OpenAI-compatible server (OpenAI, Ollama, vLLM, llama.cpp, the demo),
streamed (server-sent events) unless the server refuses to stream."""

from __future__ import annotations

import threading
from typing import Any

from agent.deadline import CallTimeout
from agent.providers import streaming
from agent.providers.base import (
    Completion,
    TextListener,
    ToolCall,
    Usage,
)
from agent.providers.http import decode_json, malformed, redact, redact_arguments
from agent.providers.server_errors import error_of, raise_reported
from agent.providers.spec import ProviderSpec
from agent.providers.sse import ERROR_EVENT, Event
from agent.providers.streaming import StreamedModel

STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}  # usage comes in a last chunk
# Said, not left to the server's default: llama-cpp-python leaves the tools out of the prompt without it.
TOOL_CHOICE = "auto"
DONE_MARKER = "[DONE]"
OPENAI_HOST = "api.openai.com"


def output_limit(base_url: str, max_tokens: int) -> dict:
    """The request's bound on output tokens: OpenAI's own API takes `max_completion_tokens` (reasoning
    included; its reasoning models refuse `max_tokens`); other servers (Ollama, vLLM, llama.cpp) read
    `max_tokens`, and some only that, so they are sent both."""
    if OPENAI_HOST in base_url.split("/")[2:3]:
        return {"max_completion_tokens": max_tokens}
    return {"max_tokens": max_tokens, "max_completion_tokens": max_tokens}


class OpenAIProvider(StreamedModel):
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
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if max_tokens is not None:
            body.update(output_limit(self.base_url, max_tokens))
        if tools:  # without tools (the last call), no tool_choice either: servers refuse one alone
            body["tools"] = tools
            body["tool_choice"] = TOOL_CHOICE
        headers = {"content-type": "application/json", "accept": "text/event-stream, application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        return self._call("/chat/completions", headers=headers, body=body, stream_fields=STREAM_FIELDS,
                          timeout=timeout, stop=stop, on_text=on_text, stream=stream, assembler=ChatStream,
                          parse=lambda data: parse_completion(data, self._api_key))


class ChatStream:
    """Chat Completions chunks -> one Completion: text deltas handed on as they come, tool-call deltas
    assembled by `index` (the id and name in a first delta, the arguments split anywhere, several
    calls interleaved), usage from the last chunk, `[DONE]` the end. Validated like parse_completion."""

    def __init__(self, on_text: TextListener | None, secret: str | None):
        self._secret = secret
        self._text = streaming.TextRelay(on_text, secret)
        self._calls: dict[int, _CallParts] = {}
        self._usage: Usage | None = None
        self._done = False

    def take(self, events: list[Event]) -> bool:
        for event in events:
            if self._done:
                break  # nothing after [DONE] counts
            if event.stray:
                streaming.raise_if_reported(event.data, self._secret)
            elif event.data.strip() == DONE_MARKER:
                self._done = True
            elif event.data.strip():  # an empty data line is a keep-alive some servers send
                self._chunk(event)
        self._text.flush()
        return self._done

    def result(self) -> Completion:
        if not self._done:
            raise streaming.cut_off(DONE_MARKER, nothing_arrived=not self._calls and not self._text.arrived)
        calls = [self._calls[index].tool_call(index, self._secret) for index in sorted(self._calls)]
        content: str | None = self._text.finish()
        if not content and calls:
            content = None
        return Completion(content=content, tool_calls=calls, usage=self._usage, streamed=True)

    def _chunk(self, event: Event) -> None:
        data = decode_json(event.data, secret=self._secret)
        if not isinstance(data, dict):
            raise malformed("a stream chunk is not a JSON object")
        if event.name == ERROR_EVENT or error_of(data) is not None:
            raise_reported(data, secret=self._secret, where="in its stream")
        if "usage" in data:
            self._usage = streaming.usage_of(data["usage"], "prompt_tokens", "completion_tokens") or self._usage
        choices = data.get("choices")
        if choices is None and "usage" in data:
            return  # a usage chunk from a server that leaves out the empty choices
        if not isinstance(choices, list):
            raise malformed("a stream chunk's 'choices' is missing or not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise malformed("a stream chunk's choice is not an object")
            if choice.get("index", 0) != 0:
                continue  # another choice than the one answer asked for
            delta = choice.get("delta", {})
            if delta is None:
                delta = {}
            if not isinstance(delta, dict):
                raise malformed("a stream chunk's 'delta' is not an object")
            self._delta(delta)

    def _delta(self, delta: dict) -> None:
        if delta.get("role") not in (None, "assistant"):
            raise malformed("the message role is not 'assistant'")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise malformed("a delta's 'content' is neither text nor null")
        if content:
            self._text.add(content)
        raw_calls = delta.get("tool_calls")
        if raw_calls is None:
            return
        if not isinstance(raw_calls, list):
            raise malformed("a delta's 'tool_calls' is not a list")
        for position, raw in enumerate(raw_calls):
            if not isinstance(raw, dict):
                raise malformed("a tool-call delta is not an object")
            index = raw.get("index", position)  # some servers leave it out when calls come whole
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise malformed("a tool-call delta's 'index' is not a whole number")
            self._calls.setdefault(index, _CallParts()).add(raw)


class _CallParts:
    """One tool call's pieces, in the order they came."""

    def __init__(self) -> None:
        self.id = ""
        self.name: list[str] = []
        self.arguments: list[str] = []

    def add(self, raw: dict) -> None:
        call_id = raw.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise malformed("a tool-call delta's id is not text")
        if call_id and not self.id:
            self.id = call_id
        if raw.get("type") not in (None, "function"):
            raise malformed("a tool-call delta's type is not 'function'")
        function = raw.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise malformed("a tool-call delta's function is not an object")
        for name, parts in (("name", self.name), ("arguments", self.arguments)):
            piece = function.get(name)
            if piece is not None and not isinstance(piece, str):
                raise malformed(f"a tool-call delta's function.{name} is not text")
            if piece:
                parts.append(piece)

    def tool_call(self, index: int, secret: str | None) -> ToolCall:
        name = "".join(self.name)
        if not self.id or not name:
            raise malformed(f"the streamed tool call {index} has no id or no name")
        # Each piece was redacted as it came; a key split across pieces is only whole here.
        arguments = "".join(self.arguments) or "{}"  # a call without arguments may send none
        return ToolCall(id=redact(self.id, secret), name=redact(name, secret),
                        arguments=redact_arguments(arguments, secret))


OPENAI = ProviderSpec(name="openai", client=OpenAIProvider, default_model="gpt-4o-mini", url_variable="OPENAI_BASE_URL",
                      default_url="https://api.openai.com/v1", key_variable="OPENAI_API_KEY")


def parse_completion(data: Any, secret: str | None = None) -> Completion:
    """Validate a Chat Completions response strictly; anything unexpected is "malformed", never a crash."""
    if not isinstance(data, dict):
        raise malformed("the body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise malformed("'choices' is missing or empty")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise malformed("'choices[0].message' is missing or not an object")
    message = choice["message"]
    if message.get("role") != "assistant":
        raise malformed("the message role is not 'assistant'")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise malformed("'content' is neither text nor null")
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise malformed("'tool_calls' is not a list")
    calls = [_tool_call(raw, index, secret) for index, raw in enumerate(raw_calls)]
    if content is None and not calls:
        content = ""
    return Completion(content=content, tool_calls=calls,
                      usage=streaming.usage_of(data.get("usage"), "prompt_tokens", "completion_tokens"))


def _tool_call(raw: Any, index: int, secret: str | None) -> ToolCall:
    where = f"tool_calls[{index}]"
    if not isinstance(raw, dict):
        raise malformed(f"{where} is not an object")
    if not isinstance(raw.get("id"), str):
        raise malformed(f"{where}.id is not text")
    if raw.get("type") != "function":
        raise malformed(f"{where}.type is not 'function'")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise malformed(f"{where}.function is not an object")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise malformed(f"{where}.function.name is not text")
    if not isinstance(function.get("arguments"), str):
        # Invalid JSON inside the string is the tool layer's business; a non-string is ours.
        raise malformed(f"{where}.function.arguments is not a string")
    # Its strings were redacted as decoded, but the arguments are JSON text of their own, read again.
    return ToolCall(id=raw["id"], name=function["name"], arguments=redact_arguments(function["arguments"], secret))
