"""The demo model as an OpenAI-compatible provider: a function from request to action, served on loopback.

Every misbehaviour a real provider can show (slowness, hanging, 429/500, a trickled body) is an
action that `agent.runtime.loopback_server` serves over real sockets, so the client's timeout and
retry paths are the ones production uses, while `DemoProvider` itself is tested by calling it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
import uuid

from agent import bounded_json
from agent.demo import stream as demo_stream
from agent.demo import tokens
from agent.demo.model import respond
from agent.demo.scenarios import Scenario, UnknownModelError, model_names, parse_model_name
from agent.runtime.loopback_server import Action, LoopbackServer, Request, delayed, hang, reply, stream, trickle
from agent.runtime.stop_signals import record_stop_signals

HANG_CAP_S = 600.0  # seconds; a hanging request is dropped after this even if the client never goes away
TRICKLE_BYTES_PER_S = 1.0  # the `trickle` scenario's body rate
FLAKY_RETRY_AFTER_S = 1  # seconds, sent as Retry-After with the flaky 429
FLAKY_MAX_KEYS = 10_000  # attempt counters are forgotten past this, so a long-running server stays small


class DemoProvider:
    """The demo provider's HTTP behaviour: a request -> the action that answers it.

    OpenAI's routes (`/v1/models`, `/v1/chat/completions`) and its error shapes; the model's
    reply from `respond`, as one JSON body or, asked with `stream: true`, as server-sent events
    written at the scenario's rate; the scenario (from the model name) decides when and how it arrives."""

    def __init__(self) -> None:
        self._attempts: dict[str, int] = {}
        self._attempts_lock = threading.Lock()  # the server calls this from one thread a connection

    def __call__(self, request: Request) -> Action:
        path = request.path.split("?", 1)[0].rstrip("/")
        if request.method == "GET":
            return self._get(path)
        if path != "/v1/chat/completions":
            return _error(404, f"No route for POST {path}.", "invalid_request_error", "not_found")
        chat = _parse_request(request.body)
        if isinstance(chat, str):
            return _error(400, chat, "invalid_request_error", "invalid_request")
        try:
            scenario = parse_model_name(chat["model"])
        except UnknownModelError as exc:
            return _error(404, str(exc), "invalid_request_error", "model_not_found")
        return self._complete(chat, scenario)

    def _get(self, path: str) -> Action:
        if path == "/healthz":
            return reply(200, {"status": "ok"})
        if path == "/v1/models":
            models = [{"id": name, "object": "model", "created": 0, "owned_by": "demo"} for name in model_names()]
            return reply(200, {"object": "list", "data": models})
        return _error(404, f"No route for GET {path}.", "invalid_request_error", "not_found")

    def _complete(self, chat: dict, scenario: Scenario) -> Action:
        if scenario.name == "hang":
            return hang(HANG_CAP_S)
        if scenario.name == "flaky":
            attempt = self._next_attempt(_round_trip_key(chat["messages"]))
            if attempt == 1:
                return _error(429, "Rate limit reached (demo:flaky, attempt 1).", "requests", "rate_limit_exceeded",
                              headers={"Retry-After": str(FLAKY_RETRY_AFTER_S)}, delay_s=scenario.latency_s)
            if attempt == 2:
                return _error(500, "The server had an error (demo:flaky, attempt 2).", "server_error", None,
                              delay_s=scenario.latency_s)
        completion = _completion(chat, respond(chat["messages"], chat.get("tools") or [], scenario),
                                 _max_tokens(chat))
        if chat.get("stream") is True:
            return delayed(scenario.latency_s, _streamed(chat, completion, scenario))
        if scenario.name == "trickle":
            body = json.dumps(completion)
            return delayed(scenario.latency_s, trickle(body, TRICKLE_BYTES_PER_S))
        return reply(200, completion, delay_s=scenario.latency_s)

    def _next_attempt(self, key: str) -> int:
        """Count attempts at one round-trip of one conversation, across threads."""
        with self._attempts_lock:
            if len(self._attempts) >= FLAKY_MAX_KEYS and key not in self._attempts:
                self._attempts.clear()
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]


class DemoServer(LoopbackServer):
    """The demo provider served on 127.0.0.1; `url` is the OpenAI base URL (ending in /v1)."""

    def __init__(self, port: int = 0):
        super().__init__(DemoProvider(), port=port, api_path="/v1", name="agent-demo/1")


def _streamed(chat: dict, completion: dict, scenario: Scenario) -> Action:
    """The completion as server-sent events, written at the scenario's rate (trickle: a byte a second)."""
    options = chat.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    parts, interval_s = demo_stream.events(completion, chars_per_s=scenario.stream_cps, include_usage=include_usage)
    if scenario.name == "trickle":
        body = b"".join(parts)
        return stream([body[i:i + 1] for i in range(len(body))], 1.0 / TRICKLE_BYTES_PER_S)
    return stream(parts, interval_s)


def _error(status: int, message: str, kind: str, code: str | None, *, headers: dict[str, str] | None = None,
           delay_s: float = 0.0) -> Action:
    """An error in OpenAI's shape."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return reply(status, {"error": error}, headers, delay_s=delay_s)


def _parse_request(body: bytes) -> dict | str:
    """The request as a dict, or a message saying why it is not a chat completion request."""
    try:
        request = bounded_json.loads(body)
    except bounded_json.TooDeep as exc:
        return f"The request body is {exc}."
    except ValueError:
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
    for name in ("max_tokens", "max_completion_tokens"):
        value = request.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"`{name}` must be a whole number of at least 1."
    return request


def _max_tokens(request: dict) -> int | None:
    """The most the reply may write, as OpenAI reads it (max_completion_tokens first)."""
    return request.get("max_completion_tokens") or request.get("max_tokens")


def _round_trip_key(messages: list[dict]) -> str:
    """One key per conversation round-trip: the first user message plus how many answers came before."""
    first_user = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    digest = hashlib.sha256(json.dumps(first_user, sort_keys=True).encode()).hexdigest()[:16]
    answers = sum(1 for m in messages if m.get("role") == "assistant")
    return f"{digest}:{answers}"


def _completion(request: dict, message: dict, max_tokens: int | None = None) -> dict:
    """The reply as a chat completion: cut at `max_tokens` as a model stops there (finish_reason `length`),
    its usage counted as a tokenizer counts (agent/demo/tokens.py)."""
    cut = False
    if max_tokens is not None:
        message, cut = tokens.cut_reply(message, max_tokens)
    prompt_tokens = tokens.request_tokens(request["messages"], request.get("tools") or [])
    completion_tokens = tokens.reply_tokens(message)
    finish = "length" if cut else "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request["model"],
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish}
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
    stopping = record_stop_signals()
    with DemoServer(port=args.port) as server:
        print(server.url, flush=True)
        while not stopping:
            time.sleep(0.2)  # the signal's handler runs as soon as the sleep is interrupted


if __name__ == "__main__":
    main()
