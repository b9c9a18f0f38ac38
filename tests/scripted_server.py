"""A scripted HTTP server on loopback for tests: canned actions for successive requests, every request recorded.

    with ScriptedServer([reply(200, {"ok": True}), hang()]) as server:
        post(server.url + "/v1/chat/completions", ...)   # gets the reply
        post(...)                                          # hangs until the client gives up or stop()
        server.requests[0].json                            # what the client sent

Actions are those of `agent.runtime.loopback_server` (reply, delayed, hang, trickle, reset, raw), plus
respond(fn) (fn(request) -> action, decided when the request arrives). When the script runs out,
`default` answers (HTTP 500 unless given).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agent.runtime.loopback_server import Action, LoopbackServer, Reply, Request, reply

REQUESTS_POLL_S = 0.01  # seconds between looks at the request log while a test waits for requests


@dataclass(frozen=True)
class Respond:
    """Decide at request time: fn(Request) returns the action."""

    fn: Callable[[Request], Action]


def respond(fn: Callable[[Request], Action]) -> Respond:
    return Respond(fn)


def chat_reply(content: str | None = "ok", tool_calls: list[dict] | None = None, **extra) -> Reply:
    """A valid OpenAI Chat Completions response, the most common script line."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}
    return reply(200, {"id": "chatcmpl-test", "object": "chat.completion", "choices": [choice], **extra})


def tool_call(name: str, arguments: dict | str, call_id: str = "call_1") -> dict:
    """One OpenAI-format tool call for chat_reply."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class ScriptedServer(LoopbackServer):
    """Serving (from construction) the script's next action for each request; `url` has no path."""

    def __init__(self, actions: Iterable[Action | Respond] = (), *, default: Action | None = None):
        self._script: collections.deque = collections.deque(actions)
        self._default = default or reply(500, {"error": {"message": "the test script has no action left"}})
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        super().__init__(self._next_action, name="scripted")
        self.start()

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def add(self, *actions: Action | Respond) -> None:
        """Append actions to the script."""
        with self._lock:
            self._script.extend(actions)

    def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> list[Request]:
        """The requests once at least `count` have arrived; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.requests) >= count:
                return self.requests
            time.sleep(REQUESTS_POLL_S)
        raise AssertionError(f"expected {count} requests, got {len(self.requests)}")

    def _next_action(self, request: Request) -> Action:
        with self._lock:
            self._requests.append(request)
            action = self._script.popleft() if self._script else self._default
        while isinstance(action, Respond):
            action = action.fn(request)
        return action
