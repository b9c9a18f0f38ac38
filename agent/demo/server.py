"""The demo model behind a real OpenAI-compatible HTTP server on loopback.

Every misbehaviour a real provider can show (slowness, hanging, 429/500, a trickled body) is served
over real sockets, so the client's timeout and retry paths are the ones production uses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import select
import signal
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.demo.model import respond
from agent.demo.scenarios import Scenario, UnknownModelError, model_names, parse_model_name

logger = logging.getLogger(__name__)

LOOPBACK_HOST = "127.0.0.1"
HANG_CAP_S = 600.0  # seconds; a hanging request is dropped after this even if the client never goes away
HANG_POLL_S = 0.2  # seconds between disconnect checks; also how fast stop() ends a hanging handler
TRICKLE_BYTE_INTERVAL_S = 1.0  # seconds between body bytes in the `trickle` scenario
FLAKY_RETRY_AFTER_S = 1  # seconds, sent as Retry-After with the flaky 429
IDLE_CONNECTION_TIMEOUT_S = 300.0  # seconds a keep-alive connection may sit idle before its thread gives up
MAX_BODY_BYTES = 10 * 1024 * 1024  # a chat history larger than this is a bug, not a request
LISTEN_BACKLOG = 1024  # the default of 5 refuses connections when 100 turns call at once
FLAKY_MAX_KEYS = 10_000  # attempt counters are forgotten past this, so a long-running server stays small


def client_left_or_stopped(
    connection: socket.socket, seconds: float | None, stopping: threading.Event, poll_s: float = HANG_POLL_S
) -> bool:
    """Wait up to `seconds` (None: for ever) without reading the request; no busy loop.

    True as soon as the client closes its end or `stopping` is set; False when the time is up.
    Shared by every loopback server that must hold a connection open (hang, slow replies)."""
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


class DemoServer:
    """An OpenAI-compatible server for the demo model, bound to 127.0.0.1 only."""

    def __init__(self, host: str = LOOPBACK_HOST, port: int = 0):
        # The server checks no API key, so it must never be reachable from another machine.
        if host != LOOPBACK_HOST:
            raise ValueError(f"The demo server only binds {LOOPBACK_HOST}, not {host!r}.")
        self._stop = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._attempts: dict[str, int] = {}
        self._attempts_lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.demo = self
        self._thread: threading.Thread | None = None
        bound_host, bound_port = self._httpd.server_address[:2]
        self.url = f"http://{bound_host}:{bound_port}/v1"

    def start(self) -> DemoServer:
        """Serve in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="demo-server", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket, and end open handlers (hanging, trickling, idle) promptly."""
        self._stop.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        # Idle keep-alive handlers block in a read; shutting their sockets down makes that read return.
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client or the handler

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _next_attempt(self, key: str) -> int:
        """Count attempts at one round-trip of one conversation, across threads."""
        with self._attempts_lock:
            if len(self._attempts) >= FLAKY_MAX_KEYS and key not in self._attempts:
                self._attempts.clear()
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() ends handlers through the stop event, it does not wait for them
    request_queue_size = LISTEN_BACKLOG
    demo: DemoServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so every response carries a Content-Length
    server_version = "agent-demo/1"
    timeout = IDLE_CONNECTION_TIMEOUT_S
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.demo._connections_lock:
            self.server.demo._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.demo._connections_lock:
            self.server.demo._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # the client went away mid-response; nothing left to flush

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
        # The request line and status only: headers carry API keys and are never logged.
        logger.debug("%s %s", self.address_string(), format % args)

    # --- routes ---

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/healthz":
            self._send_json(200, {"status": "ok"})
        elif path == "/v1/models":
            models = [{"id": name, "object": "model", "created": 0, "owned_by": "demo"} for name in model_names()]
            self._send_json(200, {"object": "list", "data": models})
        else:
            self._send_error(404, f"No route for GET {path}.", "invalid_request_error", "not_found")

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
        path = self.path.split("?", 1)[0].rstrip("/")
        body = self._read_body()
        if body is None:
            return
        if path != "/v1/chat/completions":
            self._send_error(404, f"No route for POST {path}.", "invalid_request_error", "not_found")
            return
        request = _parse_request(body)
        if isinstance(request, str):
            self._send_error(400, request, "invalid_request_error", "invalid_request")
            return
        try:
            scenario = parse_model_name(request["model"])
        except UnknownModelError as exc:
            self._send_error(404, str(exc), "invalid_request_error", "model_not_found")
            return
        self._complete(request, scenario)

    # --- scenarios ---

    def _complete(self, request: dict, scenario: Scenario) -> None:
        if scenario.name == "hang":
            self._hang()
            return
        if self.server.demo._stop.wait(scenario.latency_s):
            self.close_connection = True  # shutting down: drop the call, as a dying server would
            return
        if scenario.name == "flaky":
            attempt = self.server.demo._next_attempt(_round_trip_key(request["messages"]))
            if attempt == 1:
                self._send_error(
                    429,
                    "Rate limit reached (demo:flaky, attempt 1).",
                    "requests",
                    "rate_limit_exceeded",
                    headers={"Retry-After": str(FLAKY_RETRY_AFTER_S)},
                )
                return
            if attempt == 2:
                self._send_error(500, "The server had an error (demo:flaky, attempt 2).", "server_error", None)
                return
        message = respond(request["messages"], request.get("tools") or [], scenario)
        payload = _completion(request, message)
        if scenario.name == "trickle":
            self._trickle(payload)
        else:
            self._send_json(200, payload)

    def _hang(self) -> None:
        """Send nothing until the client disconnects, the server stops, or the cap passes; no busy loop."""
        self.close_connection = True
        client_left_or_stopped(self.connection, HANG_CAP_S, self.server.demo._stop, HANG_POLL_S)

    def _trickle(self, payload: dict) -> None:
        """A correct response whose body arrives one byte a second, defeating per-read timeouts."""
        body = json.dumps(payload).encode()
        self.close_connection = True  # if we stop midway the connection cannot be reused
        try:
            self._send_headers(200, len(body))
            for index in range(len(body)):
                self.wfile.write(body[index : index + 1])
                self.wfile.flush()
                if index + 1 < len(body) and self.server.demo._stop.wait(TRICKLE_BYTE_INTERVAL_S):
                    return
        except OSError:
            return  # the client gave up, which is the point of this scenario

    # --- plumbing ---

    def _read_body(self) -> bytes | None:
        length_header = self.headers.get("Content-Length")
        try:
            length = int(length_header) if length_header is not None else 0
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True  # the rest of the stream cannot be framed
            self._send_error(400, "Bad or too large Content-Length.", "invalid_request_error", "invalid_request")
            return None
        return self.rfile.read(length) if length else b""

    def _send_headers(self, status: int, length: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def _send_json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        try:
            self._send_headers(status, len(body), headers)
            self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the client left before the answer; nothing to do

    def _send_error(
        self, status: int, message: str, kind: str, code: str | None, headers: dict[str, str] | None = None
    ) -> None:
        error = {"message": message, "type": kind, "param": None, "code": code}
        self._send_json(status, {"error": error}, headers)


def _parse_request(body: bytes) -> dict | str:
    """The request as a dict, or a message saying why it is not a chat completion request."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return "The request body is not valid JSON."
    if not isinstance(request, dict):
        return "The request body must be a JSON object."
    if not isinstance(request.get("model"), str):
        return "The request must name a `model` (a string)."
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return "`messages` must be a non-empty list of message objects."
    if not isinstance(request.get("tools") or [], list):
        return "`tools` must be a list."
    return request


def _round_trip_key(messages: list[dict]) -> str:
    """One key per conversation round-trip: the first user message plus how many answers came before."""
    first_user = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    digest = hashlib.sha256(json.dumps(first_user, sort_keys=True).encode()).hexdigest()[:16]
    answers = sum(1 for m in messages if m.get("role") == "assistant")
    return f"{digest}:{answers}"


def _completion(request: dict, message: dict) -> dict:
    # Rough token counts (4 characters a token): enough for a usage display, and deterministic.
    prompt_tokens = len(json.dumps(request["messages"])) // 4 + 1
    completion_tokens = len(json.dumps(message)) // 4 + 1
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request["model"],
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def main(argv: list[str] | None = None) -> None:
    """`python -m agent.demo.server [--port N]`: serve on 127.0.0.1 until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m agent.demo.server", description="The demo model on loopback.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    args = parser.parse_args(argv)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    with DemoServer(port=args.port) as server:
        print(server.url, flush=True)
        while not stopping.wait(0.5):  # a timed wait, so the signal handler gets to run promptly
            pass


if __name__ == "__main__":
    main()
