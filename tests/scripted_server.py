"""A scripted HTTP server on loopback for tests: canned actions for successive requests, every request recorded.

    with ScriptedServer([reply(200, {"ok": True}), hang()]) as server:
        post(server.url + "/v1/chat/completions", ...)   # gets the reply
        post(...)                                          # hangs until the client gives up or stop()
        server.requests[0].json                            # what the client sent

Actions: reply(status, json_body, headers, body=..., delay_s=...), hang(), trickle(body, bytes_per_second),
reset_mid_body(body), raw(data), respond(fn) (fn(request) -> action). When the script runs out, `default`
answers (HTTP 500 unless given). Real sockets, HTTP/1.1 keep-alive, so timeouts and resets are the real ones.
"""

from __future__ import annotations

import collections
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.demo.server import client_left_or_stopped

POLL_S = 0.05  # seconds between checks for stop() or a client that went away


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lowercased
    body: bytes
    json: Any  # the parsed body, or None when it is not JSON
    client_port: int  # the same port on two requests means the connection was reused
    received_at: float  # time.monotonic()


@dataclass(frozen=True)
class Reply:
    status: int = 200
    json_body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # raw body instead of json_body (e.g. malformed JSON)
    delay_s: float = 0.0  # wait before answering (a slow model)


@dataclass(frozen=True)
class Hang:
    """Never answer; release when the client disconnects or the server stops."""


@dataclass(frozen=True)
class Trickle:
    body: bytes
    bytes_per_second: float
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ResetMidBody:
    """Send the headers and part of the body, then close with a TCP RST."""

    body: bytes
    sent_bytes: int | None = None  # default: half of the body
    status: int = 200


@dataclass(frozen=True)
class Raw:
    """Write these bytes as the whole response (e.g. not HTTP at all), then close."""

    data: bytes


@dataclass(frozen=True)
class Respond:
    """Decide at request time: fn(RecordedRequest) returns one of the other actions."""

    fn: Callable[[RecordedRequest], Any]


def reply(
    status: int = 200,
    json_body: Any = None,
    headers: dict | None = None,
    *,
    body: bytes | str | None = None,
    delay_s: float = 0.0,
) -> Reply:
    if isinstance(body, str):
        body = body.encode()
    return Reply(status, json_body, dict(headers or {}), body, delay_s)


def hang() -> Hang:
    return Hang()


def trickle(body: bytes | str, bytes_per_second: float, *, status: int = 200, headers: dict | None = None) -> Trickle:
    return Trickle(body.encode() if isinstance(body, str) else body, bytes_per_second, status, dict(headers or {}))


def reset_mid_body(body: bytes | str, sent_bytes: int | None = None, *, status: int = 200) -> ResetMidBody:
    return ResetMidBody(body.encode() if isinstance(body, str) else body, sent_bytes, status)


def raw(data: bytes | str) -> Raw:
    return Raw(data.encode() if isinstance(data, str) else data)


def respond(fn: Callable[[RecordedRequest], Any]) -> Respond:
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


class ScriptedServer:
    def __init__(self, actions: Iterable[Any] = (), *, default: Any = None, host: str = "127.0.0.1"):
        self._script: collections.deque = collections.deque(actions)
        self._default = default or reply(500, {"error": {"message": "the test script has no action left"}})
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self.stopping = threading.Event()
        self._httpd = _Server((host, 0), _Handler)
        self._httpd.script = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": POLL_S}, name="scripted-server", daemon=True
        )
        self._thread.start()
        self._stopped = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def add(self, *actions: Any) -> None:
        """Append actions to the script."""
        with self._lock:
            self._script.extend(actions)

    def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> list[RecordedRequest]:
        """The requests once at least `count` have arrived; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(self.requests) >= count:
                return self.requests
            time.sleep(0.01)
        raise AssertionError(f"expected {count} requests, got {len(self.requests)}")

    def stop(self) -> None:
        """Stop promptly: release hanging and trickling handlers and close every open connection."""
        if self._stopped:
            return
        self._stopped = True
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked reading the next keep-alive request
            except OSError:
                pass
        self._thread.join(timeout=2)

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # --- used by the handler ---

    def _next_action(self, request: RecordedRequest) -> Any:
        with self._lock:
            self._requests.append(request)
            action = self._script.popleft() if self._script else self._default
        while isinstance(action, Respond):
            action = action.fn(request)
        return action

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            (self._connections.add if open_ else self._connections.discard)(conn)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    script: ScriptedServer

    def handle_error(self, request, client_address) -> None:
        pass  # a client hanging up on a hanging or trickling handler is the point of most tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is tested for real
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.script._track(self.connection, True)

    def finish(self) -> None:
        self.server.script._track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            json=parsed,
            client_port=self.client_address[1],
            received_at=time.monotonic(),
        )
        action = self.server.script._next_action(request)
        try:
            self._perform(action)
        except OSError:
            self.close_connection = True  # the client went away; nothing left to do

    def _perform(self, action: Any) -> None:
        stopping = self.server.script.stopping
        if isinstance(action, Reply):
            if action.delay_s and self._wait(action.delay_s):
                return
            body = action.body if action.body is not None else json.dumps(action.json_body).encode()
            self._head(action.status, len(body), action.headers)
            self.wfile.write(body)
        elif isinstance(action, Hang):
            self._wait(None)
            self.close_connection = True
        elif isinstance(action, Trickle):
            self._head(action.status, len(action.body), action.headers)
            pause_s = 1.0 / action.bytes_per_second
            for i in range(len(action.body)):
                self.wfile.write(action.body[i : i + 1])
                self.wfile.flush()
                if i + 1 < len(action.body) and self._wait(pause_s):
                    return
        elif isinstance(action, ResetMidBody):
            sent = len(action.body) // 2 if action.sent_bytes is None else action.sent_bytes
            self._head(action.status, len(action.body), {})
            self.wfile.write(action.body[:sent])
            self.wfile.flush()
            # SO_LINGER 0 makes close() send RST; rfile holds a reference that would delay the real close.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.connection.close()
            self.close_connection = True
        elif isinstance(action, Raw):
            self.wfile.write(action.data)
            self.wfile.flush()
            self.close_connection = True
        else:
            raise TypeError(f"unknown scripted action {action!r}")
        if stopping.is_set():
            self.close_connection = True

    def _head(self, status: int, length: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        names = {name.lower() for name in headers}
        if "content-type" not in names:
            self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()

    def _wait(self, seconds: float | None) -> bool:
        """Sleep up to `seconds` (None: for ever); True when the client left or the server is stopping."""
        if client_left_or_stopped(self.connection, seconds, self.server.script.stopping, POLL_S):
            self.close_connection = True
            return True
        return False
