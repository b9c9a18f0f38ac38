"""The provider interface: one method, and the error types everything above this layer sees.

Nothing above agent/providers/ imports httpx: transport errors become ProviderError here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from agent.contract import ProviderErrorKind  # noqa: F401 (the providers name it from here)
from agent.deadline import CallTimeout


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True)
class Usage:
    """Tokens a call used, as the provider reported them (None: it did not say)."""

    input_tokens: int | None = None  # all of the input, cached or not
    output_tokens: int | None = None  # reasoning and thinking included, as the providers bill them
    cached_input_tokens: int | None = None  # of the input, what was read from the provider's cache


@dataclass(frozen=True)
class Completion:
    """One validated model response."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None
    streamed: bool = field(default=False, compare=False)  # it came as an event stream (False: one plain reply)
    def as_message(self) -> dict:
        """The assistant message in OpenAI chat format, for the history."""
        message: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message




class ProviderError(Exception):
    """A call failed. `kind` is a ProviderErrorKind; `message` is for a person. Whether it is asked
    again is the retry policy's to say (agent.providers.retry)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        nothing_streamed: bool = False,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
        # A stream that ended before its end marker with no text and no tool call in it: some servers
        # (llama-cpp-python) end a stream that way on an error they report plainly to a plain request.
        self.nothing_streamed = nothing_streamed


TextListener = Callable[[str], None]  # receives each piece of an answer's text as it arrives


class Provider(Protocol):
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
        """One model call, bounded as a whole by `timeout.total_s`, and ended at once when `stop`
        is set (from another thread). Raises ProviderError. `stream=False` asks for one plain reply (the
        turn asks it only of a provider that streamed: a Completion marked `streamed`, or a
        ProviderError marked `nothing_streamed`). `max_tokens` bounds the reply's output tokens (the turn's
        budget, agent/spend.py; asked only when it has one: None leaves the provider's own limit).

        `on_text` is called, from the caller's thread and in order, with the answer's text as it
        arrives: whole characters, one call per network read at most (tool calls never reach it).
        The pieces joined are the Completion's content; its time counts against the call's timeout,
        and an exception it raises ends the call and propagates unchanged. A streamed reply that ends
        before its end marker is a CONNECTION error (cut off), never a shorter answer."""
        ...


class RemoteModel:
    """What every client over HTTP keeps: its server, its model, and a key that never prints."""

    def __init__(self, base_url: str, model: str, api_key: str | None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key or None

    def __repr__(self) -> str:
        # Never the key: providers end up in logs and tracebacks.
        key = "set" if self._api_key else "none"
        return f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r}, key={key})"
