"""A misbehaving OpenAI-compatible provider, for the fault runner: a function from request to action,
served on loopback by `agent.runtime.loopback_server`.

Every request names its run in the `model` field ("fault-<run>", "fault-<run>-slow"); the provider keeps one RNG
per run, seeded from the runner's seed and the run number, and draws a fault for each call:
hang, trickle, 429 (with and without Retry-After), 500/503/529, a socket closed before any
reply, a reset in the middle of the body, malformed JSON, the wrong schema, tool calls that
fail (unknown tool, bad arguments, path-like time zones, calculator escapes), slow tools, a
reply of many side-effecting ledger calls among quick ones, a slow reply, or a good answer. Every
reply it completed is recorded, so the runner can check that what reached the chat is what the model
said, once and in order.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from agent.demo import stream as demo_stream
from agent.demo import tokens
from agent.runtime.loopback_server import Action, Request, delayed, hang, reply, reset, stream, trickle
from faults import budgets

HANG_CAP_S = 120.0  # seconds; a hanging handler gives up even if the client never leaves
# Seconds a trickled body takes in all: either quick enough to finish inside a call's timeout, or far too slow.
TRICKLE_SECONDS = (0.5, 1.0, 30.0)

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
    "tool_ledger": 3,
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
    "slow_answer": 6, "tool_slow": 6, "tool_ledger": 6, "tool_ok": 4, "hang": 2, "trickle": 3, "429_retry_after": 2,
    "answer": 2,
}
LEDGER_CALLS = (6, 16)  # a tool_ledger reply asks for this many calls (at random, both included)
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
    """What the provider did for one run."""

    rng: random.Random
    faults: list[str] = field(default_factory=list)
    served: list[dict] = field(default_factory=list)  # assistant messages whose reply was fully written
    calls: int = 0
    counted_tokens: int = 0  # budget runs: the input and output tokens of every reply it gave, as it counted them


class FaultProvider:
    """A request -> the action of a fault drawn from its run's seeded RNG (serve it with LoopbackServer)."""

    def __init__(self, seed: int, *, slow_tool_max_s: float = 6.0, answer_delay_max_s: float = 2.0):
        self.seed = seed
        self.slow_tool_max_s = slow_tool_max_s
        self.answer_delay_max_s = answer_delay_max_s
        self.runs: dict[str, RunLog] = {}
        self._lock = threading.Lock()  # the server calls this from one thread a connection

    def __call__(self, request: Request) -> Action:
        body = request.json
        model = str(body.get("model", "unknown")) if isinstance(body, dict) else "unknown"
        kind, run, number = self.draw(model)
        return self.action(kind, run, model, number, body if isinstance(body, dict) else {})

    def run_log(self, model: str) -> RunLog:
        with self._lock:
            if model not in self.runs:
                self.runs[model] = RunLog(random.Random(f"{self.seed}:{model}"))
            return self.runs[model]

    def draw(self, model: str) -> tuple[str, RunLog, int]:
        run = self.run_log(model)
        with self._lock:
            table = SLOW_CALL_FAULTS if model.endswith("-slow") else CALL_FAULTS
            kind = run.rng.choices(list(table), weights=list(table.values()))[0]
            run.calls += 1
            run.faults.append(kind)
            return kind, run, run.calls

    def action(self, kind: str, run: RunLog, model: str, number: int, request: dict | None = None) -> Action:
        """What call `number` of this run gets for fault `kind`; a reply the model completes is recorded
        in `run.served` just before its last byte, since the client may act on it at once. A budget run's reply
        (faults/budgets.py) is cut at the request's max_tokens, its tokens counted, and its usage reported
        (or not) as the run's mode says, streamed when the run streams."""
        rng = random.Random(f"{self.seed}:{model}:{number}")  # details of this call
        usage_mode, streams = budgets.mode_of(model)
        if usage_mode is not None and kind.startswith("tool_") and request is not None and not request.get("tools"):
            kind = "answer"  # a budget run's last call offers no tools: a model offered none answers
        if kind in ("answer", "slow_answer", "trickle") or kind.startswith("tool_"):
            if kind.startswith("tool_"):
                message = tool_message(kind, model, number, rng, self.slow_tool_max_s)
            else:
                extra = " word" * rng.choice(budgets.ANSWER_WORDS) if usage_mode else ""
                message = {"role": "assistant", "content": f"answer {number} for {model}{extra}"}
            usage = None
            if usage_mode is not None:
                request = request or {}
                limit = request.get("max_completion_tokens") or request.get("max_tokens")
                if isinstance(limit, int) and limit > 0:
                    message, _ = tokens.cut_reply(message, limit)
                counted_in = tokens.request_tokens(request.get("messages") or [], request.get("tools") or [])
                counted_out = tokens.reply_tokens(message)
                with self._lock:
                    run.counted_tokens += counted_in + counted_out
                usage = {"prompt_tokens": counted_in, "completion_tokens": counted_out,
                         "total_tokens": counted_in + counted_out}
            served = partial(run.served.append, message)
            completion = _completion(message)
            if usage is not None and streams and request.get("stream") is True and kind != "trickle":
                options = request.get("stream_options") or {}
                asked = isinstance(options, dict) and options.get("include_usage") is True
                completion.update(model=model, usage=usage)
                parts, _ = demo_stream.events(completion, chars_per_s=0, include_usage=usage_mode == "late" or (
                    usage_mode == "asked" and asked))
                delay_s = rng.uniform(0.3, self.answer_delay_max_s) if kind == "slow_answer" else 0.0
                return delayed(delay_s, stream(parts, 0.0, on_last_byte=served))
            if usage is not None and usage_mode != "never":
                completion["usage"] = usage
            body = json.dumps(completion)
            if kind == "trickle":
                return trickle(body, len(body) / rng.choice(TRICKLE_SECONDS), on_last_byte=served)
            delay_s = rng.uniform(0.3, self.answer_delay_max_s) if kind == "slow_answer" else 0.0
            return reply(200, body=body, delay_s=delay_s, on_last_byte=served)
        return _failure(kind, rng)


def _failure(kind: str, rng: random.Random) -> Action:
    """The action of a fault that delivers no answer."""
    if kind == "hang":
        return hang(HANG_CAP_S)
    if kind.startswith("429"):
        headers = {}
        if kind == "429_retry_after":
            headers["Retry-After"] = f"{rng.uniform(0.2, 1.2):.1f}"
        elif kind == "429_long_retry_after":
            headers["Retry-After"] = "30"
        return reply(429, {"error": {"message": "slow down"}}, headers)
    if kind in ("500", "503", "529"):
        return reply(int(kind), {"error": {"message": "the provider is having a bad day"}})
    if kind == "close":
        return reset()
    if kind == "reset_mid_body":
        return reset(json.dumps(_completion({"role": "assistant", "content": "cut short"})))
    if kind == "malformed_json":
        return reply(200, body=rng.choice([b'{"choices": [ {"message": ', b"<html>oops</html>", b"", b"[[[[" * 5000]))
    if kind == "wrong_schema":
        return reply(200, rng.choice(WRONG_SCHEMAS))
    raise ValueError(kind)


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
    elif kind == "tool_ledger":
        # Side effects (faults/ledger.py) among quick tools that are safe to repeat, whose results go out in
        # batches: a process fault lands between any two of them, or inside one.
        calls = [_call(model, number, i, "ledger", {"entry": f"{model}-{number}-{i}",
                                                    "pause_s": round(rng.uniform(0.0, 0.15), 3)})
                 if rng.random() < 0.6 else _call(model, number, i, "calculator", {"expression": f"{i}*{i}"})
                 for i in range(rng.randint(*LEDGER_CALLS))]
    else:
        raise ValueError(kind)
    return {"role": "assistant", "content": None, "tool_calls": calls}
