"""What `python -m agent ask` prints of each new version of a turn: each printer prints only what
the version added. `JsonLines` (`--json`): one JSON object a line, a delta until the last, which is
the whole state. `TextLines`: the reply's text as it is written, then the turn's new messages as
plain text; each model call's tokens and cost, and the turn's, go to stderr."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from agent.contract import LIST_FIELDS, Kind, Live, Outcome, Role, State
from agent.spend import budget_text, money, spend_words
from agent.text.plain_text import TERMINAL_ACTIVE, PlainTextStream, plain_text, terminal_safe

# How a text that never became a message is marked, by its model step's outcome.
CUT_MARKS = {Outcome.TIMEOUT: "cut off: the call timed out", Outcome.STOPPED: "stopped at your request",
             Outcome.ERROR: "cut off: the call failed"}

_JSON_SAFE = {cp: f"\\u{cp:04x}" for cp in TERMINAL_ACTIVE if cp >= 0x7F}  # JSON escapes the C0 ones itself


def _nothing_printed() -> dict:
    return dict.fromkeys(LIST_FIELDS, 0)


@dataclass
class JsonLines:
    """`--json`: each version as one line, the small fields and what each list and the live text added."""

    turn_id: str
    printed: dict = field(default_factory=_nothing_printed)  # items printed, per list
    live_id: tuple | None = None  # (message_index, attempt) of the live text printed last
    live_chars: int = 0  # its characters printed so far

    def print(self, state: State, *, final: bool) -> None:
        if final:
            line = {**state, "delta": False}
        else:
            line = {k: v for k, v in state.items() if k not in LIST_FIELDS}
            line["delta"] = True
            for name in LIST_FIELDS:
                line[f"{name}_from"] = self.printed[name]
                line[f"new_{name}"] = state[name][self.printed[name]:]
            line.update(self.live_json(state["live"]))
        # What a terminal acts on is escaped (\uXXXX is valid JSON anywhere a string holds it).
        print(json.dumps(line, ensure_ascii=False).translate(_JSON_SAFE), flush=True)
        self.printed = {name: len(state[name]) for name in LIST_FIELDS}

    def live_json(self, live: Live | None) -> dict:
        """The live text as a delta: its head, and the characters added since the line before."""
        if live is None or live["turn_id"] != self.turn_id:
            self.live_id, self.live_chars = None, 0
            return {"live": None}
        live_id = (live["message_index"], live["attempt"])
        start = self.live_chars if live_id == self.live_id else 0  # a fresh text (a retry) starts at 0
        self.live_id, self.live_chars = live_id, len(live["text"])
        return {"live": {k: v for k, v in live.items() if k != "text"}, "live_from": start,
                "live_delta": live["text"][start:]}


@dataclass
class TextLines:
    """Plain text: the reply as it is written and the turn's new messages; a text cut off or stopped
    mid-way is marked so, and each model call's tokens go to stderr."""

    turn_id: str
    printed: dict = field(default_factory=_nothing_printed)  # items printed, per list
    started: bool = False  # a first version was printed
    live_id: tuple | None = None  # (message_index, attempt) of the live text being printed
    stream: PlainTextStream | None = None  # the live text being printed, until its message lands
    tokens: list = field(default_factory=lambda: [0, 0, 0])  # input, output tokens, calls that reported
    model_calls: int = 0  # this turn's model calls so far, as a person counts them (steps count retries too)

    def print(self, state: State, *, final: bool = False) -> None:
        history = state["history"]
        if not self.started:
            # An earlier conversation is not printed again: this turn starts at its user message.
            users = [i for i, m in enumerate(history) if m.get("role") == Role.USER]
            self.printed["history"] = users[-1] if users else 0
            self.started = True
        for step in state["steps"][self.printed["steps"]:]:
            self.print_model_step(step)  # this turn's only
        self.printed["steps"] = len(state["steps"])
        for index in range(self.printed["history"], len(history)):
            self.print_message(index, history[index])
        self.printed["history"] = len(history)
        self.print_live(state["live"])

    def print_message(self, index: int, message: dict) -> None:
        role = message.get("role")
        streamed = self.stream if self.live_id and self.live_id[0] == index else None
        if streamed is not None:  # its text was printed as it was written: the rest of it
            print(terminal_safe(streamed.finish(message.get("content") or "")), flush=True)
            self.stream, self.live_id = None, None
        if role == Role.USER:
            return
        if role == Role.TOOL:
            print(terminal_safe(f"  [tool] {message.get('content', '')}"), flush=True)
        elif message.get("tool_calls"):
            for call in message["tool_calls"]:
                fn = call.get("function", {})
                print(terminal_safe(f"  [calls {fn.get('name')}] {fn.get('arguments')}"), flush=True)
        elif streamed is None:
            print(terminal_safe(plain_text(message.get("content"))), flush=True)

    def print_live(self, live: Live | None) -> None:
        """The reply's text as it is written: each settled piece once, on one line with the next."""
        if live is None or live["turn_id"] != self.turn_id:
            return
        live_id = (live["message_index"], live["attempt"])
        if live_id != self.live_id:
            if self.live_id is not None and self.stream is not None and self.stream.done:
                print(flush=True)  # the text before was cut: what follows starts on a line of its own
            if live["attempt"] > 1:
                print(f"[attempt {live['attempt']}: the reply starts again]", file=sys.stderr, flush=True)
            self.live_id, self.stream = live_id, PlainTextStream()
        piece = self.stream.feed(live["text"])
        if piece:
            print(terminal_safe(piece), end="", flush=True)

    def print_resume(self, step: dict) -> None:
        """A resume after a lost worker (stderr), and where the text it cut ends."""
        if self.stream is not None and step.get("partial_text"):
            print(flush=True)
            self.stream, self.live_id = None, None
            print("  [cut off: the worker writing it was lost]", flush=True)
        print(terminal_safe(f"[resume {step.get('attempt')}: {step.get('detail')}]"), file=sys.stderr, flush=True)

    def print_model_step(self, step: dict) -> None:
        """A model call's tokens (stderr); a text it cut off or stopped is marked where it ends."""
        if step.get("turn_id") != self.turn_id:
            return
        if step.get("kind") == Kind.RESUME:
            self.print_resume(step)
            return
        if step.get("kind") == Kind.APPROVAL:
            print(terminal_safe(f"[approval of {step.get('name')}: {step.get('detail')}]"), file=sys.stderr,
                  flush=True)
            return
        if step.get("kind") != Kind.MODEL:
            return
        self.model_calls += 1
        if step.get("unstreamed"):
            print(terminal_safe(f"[model call {self.model_calls}: asked without streaming: {step['unstreamed']}]"),
                  file=sys.stderr, flush=True)
        usage = step.get("usage")
        cost = call_cost_text(step)
        if usage:
            tokens_in, tokens_out = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
            self.tokens = [self.tokens[0] + tokens_in, self.tokens[1] + tokens_out, self.tokens[2] + 1]
            print(f"[model call {self.model_calls}: {tokens_in:,} tokens in, {tokens_out:,} out{cost}]",
                  file=sys.stderr, flush=True)
        elif cost:
            print(f"[model call {self.model_calls}: no usage reported{cost}]", file=sys.stderr, flush=True)
        if "partial_text" in step:
            if self.stream is not None:
                # What arrived but was not printed yet (the last words), then the mark.
                rest = self.stream.finish(step["partial_text"]) if len(step["partial_text"]) == step.get(
                    "partial_chars") else ""
                print(terminal_safe(rest), flush=True)
                self.stream, self.live_id = None, None
            mark = CUT_MARKS.get(step.get("outcome"), "cut off")
            print(f"  [{mark}: {step['partial_chars']:,} characters had arrived]", flush=True)

    def print_tokens(self, spend: dict | None = None) -> None:
        """The turn's tokens (stderr), when any model call reported them, and what the turn cost."""
        if self.tokens[2]:
            print(f"[tokens this turn: {self.tokens[0]:,} in, {self.tokens[1]:,} out, "
                  f"{calls_text(self.model_calls, self.tokens[2])}]", file=sys.stderr, flush=True)
        if (words := spend_words(spend)) and (spend.get("usd") is not None or budget_text(spend)):
            print(f"[cost of this turn: {words}]", file=sys.stderr, flush=True)


def call_cost_text(step: dict) -> str:
    """", $0.0021, max_tokens 1,232": a model call's cost (marked when it is its worst case), and its limit."""
    parts = []
    if step.get("cost_usd") is not None:
        parts.append(money(step["cost_usd"]))
    elif step.get("cost_tokens") is not None and step.get("cost_worst"):  # else: the tokens it reported
        parts.append(f"{step['cost_tokens']:,} tokens charged")
    if parts and step.get("cost_worst"):
        parts[-1] += " (worst case: not reported)"
    if step.get("max_tokens") is not None:
        parts.append(f"max_tokens {step['max_tokens']:,}")
    return "".join(f", {part}" for part in parts)


def calls_text(calls: int, reported: int) -> str:
    """"over 3 model calls", and how many of them reported their tokens when not all did."""
    some = f", {reported} of them reporting tokens" if reported != calls else ""
    return f"over {calls} model call{'s' if calls != 1 else ''}{some}"
