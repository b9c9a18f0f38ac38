"""A misbehaving OpenAI-compatible provider on loopback, for the fault runner.

Every request names its run in the `model` field ("fault-<run>", "fault-<run>-slow"); the server keeps one RNG
per run, seeded from the runner's seed and the run number, and draws a fault for each call:
hang, trickle, 429 (with and without Retry-After), 500/503/529, a socket closed before any
reply, a reset in the middle of the body, malformed JSON, the wrong schema, tool calls that
fail (unknown tool, bad arguments, path-like time zones, calculator escapes), slow tools, a
slow reply, or a good answer. Every reply it completed is recorded, so the runner can check
that what reached the chat is what the model said, once and in order.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.demo.server import client_left_or_stopped

LOOPBACK_HOST = "127.0.0.1"
POLL_S = 0.05  # seconds between checks for a client that left or a server that stops
HANG_CAP_S = 120.0  # seconds; a hanging handler gives up even if the client never leaves

# Call faults and their weights (relative). "answer" and the tool calls let turns progress.
CALL_FAULTS: dict[str, int] = {
    "answer": 20,
    "tool_ok": 10,
    "tool_two": 4,
    "tool_bad_name": 3,
    "tool_bad_args": 3,
    "tool_path_timezone": 2,
    "tool_escape": 2,
    "tool_slow": 4,
    "slow_answer": 4,
    "hang": 5,
    "trickle": 5,
    "429_retry_after": 4,
    "429_long_retry_after": 1,
    "429_bare": 3,
    "500": 3,
    "503": 3,
    "529": 3,
    "close": 3,
    "reset_mid_body": 3,
    "malformed_json": 3,
    "wrong_schema": 4,
}
# Runs that also get a process fault lean on slow calls, so the fault lands mid-turn.
SLOW_CALL_FAULTS: dict[str, int] = {
    "slow_answer": 6, "tool_slow": 6, "tool_ok": 4, "hang": 2, "trickle": 3, "429_retry_after": 2, "answer": 2,
}
ESCAPES = (
    "().__class__.__bases__[0].__subclasses__()",
    "__import__('os').system('touch /tmp/agent-faults-pwned')",
    "9**9**9**9",
    "raise SystemExit",
    "(" * 150 + "1" + ")" * 150,
)
WRONG_SCHEMAS = (
    {"choices": []},
    {"choices": "nope"},
    {"choices": [{"message": {"role": "user", "content": "hi"}}]},
    {"choices": [{"message": {"role": "assistant", "content": 42}}]},
    {"choices": [{"message": {"role": "assistant", "tool_calls": [{"id": 1, "type": "function"}]}}]},
    {"choices": [{"message": {"role": "assistant", "tool_calls": "calculator"}}]},
    ["not", "an", "object"],
)


@dataclass
class RunLog:
    """What the server did for one run."""

    rng: random.Random
    faults: list[str] = field(default_factory=list)
    served: list[dict] = field(default_factory=list)  # assistant messages whose reply was fully written
    calls: int = 0


class FaultProvider:
    """A ThreadingHTTPServer on 127.0.0.1 that draws a fault per call from a per-run seeded RNG."""

    def __init__(self, seed: int, *, slow_tool_max_s: float = 6.0, answer_delay_max_s: float = 2.0):
        self.seed = seed
        self.slow_tool_max_s = slow_tool_max_s
        self.answer_delay_max_s = answer_delay_max_s
        self.runs: dict[str, RunLog] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd = _Server((LOOPBACK_HOST, 0), _Handler)
        self._httpd.provider = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="fault-provider", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def run_log(self, model: str) -> RunLog:
        with self._lock:
            if model not in self.runs:
                self.runs[model] = RunLog(random.Random(f"{self.seed}:{model}"))
            return self.runs[model]

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- drawing a fault -------------------------------------------------------------------

    def draw(self, model: str) -> tuple[str, RunLog, int]:
        run = self.run_log(model)
        with self._lock:
            table = SLOW_CALL_FAULTS if model.endswith("-slow") else CALL_FAULTS
            kind = run.rng.choices(list(table), weights=list(table.values()))[0]
            run.calls += 1
            run.faults.append(kind)
            return kind, run, run.calls


def _completion(message: dict) -> dict:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": int(time.time()),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def _call(model: str, number: int, index: int, name: str, arguments) -> dict:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = f"call_{model}_{number}_{index}"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_message(kind: str, model: str, number: int, rng: random.Random, slow_tool_max_s: float) -> dict:
    """The assistant message asking for tools, for a tool fault."""
    if kind == "tool_ok":
        choice = rng.choice(
            [("calculator", {"expression": "17*23"}), ("current_time", {"timezone": "Asia/Tokyo"}),
             ("search_docs", {"query": "deadline margin"})]
        )
        calls = [_call(model, number, 0, *choice)]
    elif kind == "tool_two":
        calls = [_call(model, number, 0, "calculator", {"expression": "2+2"}),
                 _call(model, number, 1, "current_time", {})]
    elif kind == "tool_bad_name":
        calls = [_call(model, number, 0, rng.choice(["os.system", "__import__", "rm_rf", ""]) or "nothing", {})]
    elif kind == "tool_bad_args":
        calls = [_call(model, number, 0, "calculator", rng.choice(['{"expression": ', '[1, 2]', '{"x": 1}',
                                                                 '{"expression": 5}']))]
    elif kind == "tool_path_timezone":
        calls = [_call(model, number, 0, "current_time", {"timezone": rng.choice(["../../etc/passwd",
                                                                                 "/etc/localtime", "..\\..\\"])})]
    elif kind == "tool_escape":
        calls = [_call(model, number, 0, "calculator", {"expression": rng.choice(ESCAPES)})]
    elif kind == "tool_slow":
        calls = [_call(model, number, 0, "wait", {"seconds": round(rng.uniform(0.2, slow_tool_max_s), 2)})]
    else:
        raise ValueError(kind)
    return {"role": "assistant", "content": None, "tool_calls": calls}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    provider: FaultProvider

    def handle_error(self, request, client_address) -> None:
        pass  # a client hanging up on a hanging or trickling reply is the point


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            model = str(json.loads(body).get("model", "unknown"))
        except (ValueError, AttributeError):
            model = "unknown"
        provider = self.server.provider
        kind, run, number = provider.draw(model)
        try:
            self._perform(kind, run, model, number)
        except OSError:
            self.close_connection = True

    def _perform(self, kind: str, run: RunLog, model: str, number: int) -> None:
        provider = self.server.provider
        rng = random.Random(f"{provider.seed}:{model}:{number}")  # details of this call
        if kind in ("answer", "slow_answer"):
            message = {"role": "assistant", "content": f"answer {number} for {model}"}
            if kind == "slow_answer" and self._wait(rng.uniform(0.3, provider.answer_delay_max_s)):
                return
            run.served.append(message)  # recorded first: the client may act on the reply before we return
            self._send(200, json.dumps(_completion(message)).encode())
        elif kind.startswith("tool_"):
            message = tool_message(kind, model, number, rng, provider.slow_tool_max_s)
            run.served.append(message)
            self._send(200, json.dumps(_completion(message)).encode())
        elif kind == "hang":
            self._wait(HANG_CAP_S)
            self.close_connection = True
        elif kind == "trickle":
            message = {"role": "assistant", "content": f"answer {number} for {model}"}
            data = json.dumps(_completion(message)).encode()
            # Either quick enough to finish inside a call's timeout, or far too slow.
            seconds = rng.choice([0.5, 1.0, 30.0])
            self._head(200, len(data))
            pause = seconds / len(data)
            for i in range(len(data)):
                if i and self._wait(pause):
                    return
                if i == len(data) - 1:
                    run.served.append(message)  # before the last byte: the client may act on it at once
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
        elif kind.startswith("429"):
            headers = {}
            if kind == "429_retry_after":
                headers["Retry-After"] = f"{rng.uniform(0.2, 1.2):.1f}"
            elif kind == "429_long_retry_after":
                headers["Retry-After"] = "30"
            self._send(429, b'{"error": {"message": "slow down"}}', headers)
        elif kind in ("500", "503", "529"):
            self._send(int(kind), b'{"error": {"message": "the provider is having a bad day"}}')
        elif kind == "close":
            self._abort()
        elif kind == "reset_mid_body":
            data = json.dumps(_completion({"role": "assistant", "content": "cut short"})).encode()
            self._head(200, len(data))
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self._abort()
        elif kind == "malformed_json":
            self._send(200, rng.choice([b'{"choices": [ {"message": ', b"<html>oops</html>", b"", b"[[[[" * 5000]))
        elif kind == "wrong_schema":
            self._send(200, json.dumps(rng.choice(WRONG_SCHEMAS)).encode())
        else:
            raise ValueError(kind)

    def _head(self, status: int, length: int, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()

    def _send(self, status: int, data: bytes, headers: dict | None = None) -> None:
        self._head(status, len(data), headers)
        self.wfile.write(data)
        self.wfile.flush()

    def _abort(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), with nothing more sent."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.connection.close()
        self.close_connection = True

    def _wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when the client left or the server is stopping."""
        if client_left_or_stopped(self.connection, seconds, self.server.provider.stopping, POLL_S):
            self.close_connection = True
            return True
        return False
