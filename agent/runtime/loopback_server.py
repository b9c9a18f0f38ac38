"""A loopback HTTP server whose behaviour is a plain function from request to action.

    server = LoopbackServer(lambda request: reply(200, {"ok": True})).start()
    ...
    server.stop()

The function decides what a request gets: `reply` (optionally `delayed`), `hang` until the client
leaves or the server stops, `trickle` the body a few bytes a second, `stream` it in parts (server-sent
events, chunked) at a pace, `reset` the connection, or `raw` bytes that are not HTTP at all. The
function does no I/O of its own, so a provider's behaviour is tested by calling it; this module
serves it over real sockets (HTTP/1.1 keep-alive, one thread a connection), so a client's timeouts,
retries and resets are the real ones. The demo provider, the fault runner's provider and the tests'
scripted server are such functions.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

logger = logging.getLogger(__name__)

LOOPBACK_HOST = "127.0.0.1"
WAIT_POLL_S = 0.1  # seconds between checks of the stop flag while a handler holds a connection open
IDLE_CONNECTION_TIMEOUT_S = 300.0  # seconds a keep-alive connection may sit idle before its thread gives up
MAX_BODY_BYTES = 10 * 1024 * 1024  # a request body larger than this is a bug, not a request
LISTEN_BACKLOG = 1024  # the default of 5 refuses connections when 100 turns call at once
STOP_JOIN_S = 5.0  # seconds stop() waits for the serving thread


@dataclass(frozen=True)
class Request:
    """One request as the server read it."""

    method: str
    path: str  # as sent: a path, or a whole URL when the client took this server for a proxy
    headers: dict[str, str] = field(default_factory=dict)  # names lowercased
    body: bytes = b""
    client_port: int = 0  # the same port on two requests means the connection was reused
    received_at: float = 0.0  # time.monotonic()

    @cached_property
    def json(self) -> Any:
        """The body parsed as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body) if self.body else None
        except (UnicodeDecodeError, ValueError):
            return None


class Exchange(Protocol):
    """What an action may do with the connection it answers."""

    def send_head(self, status: int, length: int | None, headers: dict[str, str]) -> None:
        """The status line and headers; `length` None: the body follows in chunks (send_chunk)."""

    def send_chunk(self, data: bytes) -> None:
        """One chunk of a chunked body; empty data ends the body."""

    def write(self, data: bytes) -> None: ...

    def wait(self, seconds: float | None) -> bool:
        """Hold the connection up to `seconds` (None: for ever); True when the client left or the server
        stops, and the connection closes after this action."""

    def reset(self) -> None:
        """Close the connection with a TCP RST, sending nothing more."""

    def close_after(self) -> None:
        """Close the connection once this action ends (no keep-alive)."""


class Action(Protocol):
    def serve(self, exchange: Exchange) -> None: ...


Handler = Callable[[Request], Action]


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    on_last_byte: Callable[[], None] | None = field(default=None, compare=False)  # just before the reply is complete

    def serve(self, exchange: Exchange) -> None:
        exchange.send_head(self.status, len(self.body), self.headers)
        if self.on_last_byte is not None:
            self.on_last_byte()
        exchange.write(self.body)


@dataclass(frozen=True)
class Trickle:
    """A correct reply whose body arrives a byte at a time, which defeats per-read timeouts."""

    body: bytes
    bytes_per_second: float
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    on_last_byte: Callable[[], None] | None = field(default=None, compare=False)

    def serve(self, exchange: Exchange) -> None:
        exchange.close_after()  # if it stops midway the connection cannot be reused
        exchange.send_head(self.status, len(self.body), self.headers)
        pause_s = 1.0 / self.bytes_per_second
        for index in range(len(self.body)):
            if index and exchange.wait(pause_s):
                return
            if index == len(self.body) - 1 and self.on_last_byte is not None:
                self.on_last_byte()
            exchange.write(self.body[index : index + 1])


@dataclass(frozen=True)
class Stream:
    """A body sent in parts, `interval_s` apart, as chunked transfer encoding: server-sent events as a
    model writes them (each part is one chunk on the wire, so a part can end mid-character). With
    `stall`, the body never ends: after the parts the connection is held until the client leaves."""

    parts: tuple[bytes, ...]
    interval_s: float = 0.0
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    stall: bool = False
    on_last_byte: Callable[[], None] | None = field(default=None, compare=False)  # just before the last part

    def serve(self, exchange: Exchange) -> None:
        exchange.close_after()  # a stream cut short leaves the connection unusable
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self.headers}
        exchange.send_head(self.status, None, headers)
        for index, part in enumerate(self.parts):
            if index and self.interval_s > 0 and exchange.wait(self.interval_s):
                return
            if index == len(self.parts) - 1 and self.on_last_byte is not None:
                self.on_last_byte()
            if part:
                exchange.send_chunk(part)
        if self.stall:
            exchange.wait(None)
            return
        exchange.send_chunk(b"")


@dataclass(frozen=True)
class Delayed:
    """Wait, then serve `then`; a client that leaves or a server that stops meanwhile gets nothing."""

    seconds: float
    then: Action

    def serve(self, exchange: Exchange) -> None:
        if self.seconds > 0 and exchange.wait(self.seconds):
            return
        self.then.serve(exchange)


@dataclass(frozen=True)
class Hang:
    """Send nothing until the client leaves, the server stops, or `cap_s` passes (None: no cap)."""

    cap_s: float | None = None

    def serve(self, exchange: Exchange) -> None:
        exchange.close_after()
        exchange.wait(self.cap_s)


@dataclass(frozen=True)
class Reset:
    """A TCP RST: at once (no body), or after the headers and `sent_bytes` of the body (default: half)."""

    body: bytes | None = None
    sent_bytes: int | None = None
    status: int = 200

    def serve(self, exchange: Exchange) -> None:
        if self.body is not None:
            sent = len(self.body) // 2 if self.sent_bytes is None else self.sent_bytes
            exchange.send_head(self.status, len(self.body), {})
            exchange.write(self.body[:sent])
        exchange.reset()


@dataclass(frozen=True)
class Raw:
    """These bytes as the whole response (e.g. not HTTP at all), then close."""

    data: bytes

    def serve(self, exchange: Exchange) -> None:
        exchange.write(self.data)
        exchange.close_after()


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def reply(
    status: int = 200,
    json_body: Any = None,
    headers: dict | None = None,
    *,
    body: bytes | str | None = None,
    delay_s: float = 0.0,
    on_last_byte: Callable[[], None] | None = None,
) -> Reply | Delayed:
    """A JSON reply (or a raw `body`, e.g. malformed JSON), `delay_s` seconds late when given."""
    data = _as_bytes(body) if body is not None else json.dumps(json_body).encode()
    answer = Reply(status, data, dict(headers or {}), on_last_byte)
    return delayed(delay_s, answer) if delay_s else answer


def delayed(seconds: float, action: Action) -> Delayed:
    return Delayed(seconds, action)


def hang(cap_s: float | None = None) -> Hang:
    return Hang(cap_s)


def trickle(
    body: bytes | str,
    bytes_per_second: float,
    *,
    status: int = 200,
    headers: dict | None = None,
    on_last_byte: Callable[[], None] | None = None,
) -> Trickle:
    return Trickle(_as_bytes(body), bytes_per_second, status, dict(headers or {}), on_last_byte)


def stream(
    parts: list[bytes | str] | tuple[bytes | str, ...],
    interval_s: float = 0.0,
    *,
    status: int = 200,
    headers: dict | None = None,
    stall: bool = False,
    on_last_byte: Callable[[], None] | None = None,
) -> Stream:
    return Stream(tuple(_as_bytes(part) for part in parts), interval_s, status, dict(headers or {}), stall,
                  on_last_byte)


def reset(body: bytes | str | None = None, sent_bytes: int | None = None, *, status: int = 200) -> Reset:
    return Reset(None if body is None else _as_bytes(body), sent_bytes, status)


def raw(data: bytes | str) -> Raw:
    return Raw(_as_bytes(data))


def client_left_or_stopped(
    connection: socket.socket, seconds: float | None, stopping: threading.Event, poll_s: float = WAIT_POLL_S
) -> bool:
    """Wait up to `seconds` (None: for ever) without reading the request; no busy loop.

    True as soon as the client closes its end or `stopping` is set; False when the time is up."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stopping.is_set():
        left = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
        if left <= 0:
            return False
        try:
            readable, _, _ = select.select([connection], [], [], left)
            if readable:
                if not connection.recv(1, socket.MSG_PEEK):
                    return True  # the client closed its end
                stopping.wait(left)  # a pipelined request is waiting: not a disconnect, and select fires at once
        except (OSError, ValueError):
            return True  # the socket is gone (reset, or closed by a stop)
    return True


class LoopbackServer:
    """Serves `handler` on 127.0.0.1 only, each connection in its own daemon thread."""

    def __init__(self, handler: Handler, *, host: str = LOOPBACK_HOST, port: int = 0, api_path: str = "",
                 name: str = "loopback"):
        # These servers check no API key, so they must never be reachable from another machine.
        if host != LOOPBACK_HOST:
            raise ValueError(f"A loopback server only binds {LOOPBACK_HOST}, not {host!r}.")
        self.handler = handler
        self.name = name
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), _Connection)
        self._httpd.owner = self
        self._thread: threading.Thread | None = None
        bound_host, bound_port = self._httpd.server_address[:2]
        self.url = f"http://{bound_host}:{bound_port}{api_path}"  # what a client takes as its base URL

    def start(self) -> LoopbackServer:
        """Serve in a daemon thread (once); returns self."""
        if self._thread is None and not self.stopping.is_set():
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": WAIT_POLL_S}, name=self.name, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and end open handlers (hanging, trickling, idle keep-alive) promptly."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(STOP_JOIN_S)
        self._httpd.server_close()
        # Idle keep-alive handlers block in a read; shutting their sockets down makes that read return.
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client or the handler

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _track(self, connection: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            (self._connections.add if open_ else self._connections.discard)(connection)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() ends handlers through the stop event, it does not wait for them
    request_queue_size = LISTEN_BACKLOG
    owner: LoopbackServer

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client hanging up on a hanging or trickling reply is the point, not an error
        logger.exception("the handler failed on a request from %s", client_address)


class _Connection(BaseHTTPRequestHandler):
    """One client connection: reads each request, asks the handler, serves its action (the Exchange)."""

    protocol_version = "HTTP/1.1"  # keep-alive, so every response carries a Content-Length
    timeout = IDLE_CONNECTION_TIMEOUT_S
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        self.server.owner._track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass  # the client went away mid-response; nothing left to flush

    def version_string(self) -> str:
        return self.server.owner.name

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        # The request line and status only: headers carry API keys and are never logged.
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's naming
        self._handle()

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
        self._handle()

    def _handle(self) -> None:
        request = self._read_request()
        owner = self.server.owner
        try:
            action = reply(400, _BAD_LENGTH) if request is None else owner.handler(request)
            action.serve(self)
        except OSError:
            self.close_connection = True  # the client went away; nothing left to do
        if request is None or owner.stopping.is_set():
            self.close_connection = True  # a bad length leaves the stream unframed; a stopping server closes

    def _read_request(self) -> Request | None:
        """The request, or None when its Content-Length is missing a number or too large."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        if not 0 <= length <= MAX_BODY_BYTES:
            return None
        return Request(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
            client_port=self.client_address[1],
            received_at=time.monotonic(),
        )

    # --- the Exchange an action serves through ---

    def send_head(self, status: int, length: int | None, headers: dict[str, str]) -> None:
        self.send_response(status)
        if "content-type" not in {name.lower() for name in headers}:
            self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def send_chunk(self, data: bytes) -> None:
        self.write(b"%x\r\n%s\r\n" % (len(data), data))

    def wait(self, seconds: float | None) -> bool:
        if client_left_or_stopped(self.connection, seconds, self.server.owner.stopping):
            self.close_connection = True
            return True
        return False

    def reset(self) -> None:
        # SO_LINGER 0 makes close() send RST; rfile holds a reference that would delay the real close.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.connection.close()
        self.close_connection = True

    def close_after(self) -> None:
        self.close_connection = True


_BAD_LENGTH = {"error": {"message": "Bad or too large Content-Length.", "type": "invalid_request_error",
                         "param": None, "code": "invalid_request"}}
