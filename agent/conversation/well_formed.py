"""What Redis holds, read as the state contract whatever it holds: a well-formed State, or UnreadableState.

The rule, spelled once. The meta hash says where a conversation is (`version`, `done`, `turn_id`,
`doc`); if any of those is not what the store writes, the whole state is unreadable and readers say
so in a sentence (UnreadableState). Everything else is shown, never trusted: an item of `history`,
`steps` or `turns` that is not the JSON object the contract describes becomes a placeholder that
shows what was stored, as text; a field of the wrong type becomes None, or its text where the
contract wants text. Parsed JSON nests at most MAX_DEPTH deep, numbers are finite and within
MAX_NUMBER, so no later reader (a drawing, `json.dumps`, `str`) can recurse too deep or overflow.
Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re

from agent import bounded_json
from agent.contract import Kind, Outcome, Role, State, Status, make_state
from agent.conversation.errors import UnreadableState  # what the store refuses: one tree

MAX_DEPTH = bounded_json.MAX_DEPTH  # levels of JSON nesting; the store writes at most 4 (a tool call's function)
MAX_NUMBER = 1e11  # a time or a duration past this (the year 5138, or 3,000 years) is not one: None
MAX_COUNT = 10**9  # an index, attempt or count past this is not one: None
SHOWN_CHARS = 300  # characters of a malformed item shown in its placeholder
ROLES = frozenset((Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL))
_VERSION_RE = re.compile(r"[0-9]{1,18}")
UNREADABLE_KIND = "unreadable"  # the error kind of a placeholder turn summary


class Malformed(ValueError):
    """A stored value that is not the JSON this project writes."""


# -- JSON, bounded --------------------------------------------------------------------------------


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


# One decoder for every read (json.loads with options builds a new one each call).
_DECODER = json.JSONDecoder(parse_constant=lambda _name: None, parse_float=_finite)


def parse_json(raw: str | bytes, max_depth: int = MAX_DEPTH):
    """The JSON value of `raw`, nested at most `max_depth` deep, NaN and infinities read as None; else Malformed."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        raise Malformed(f"not text but {type(raw).__name__}")
    try:
        return bounded_json.loads(raw, max_depth=max_depth, decoder=_DECODER)
    except bounded_json.TooDeep as exc:
        raise Malformed(str(exc)) from exc
    except ValueError as exc:  # not JSON, or an integer of more digits than Python converts
        raise Malformed(f"not JSON ({exc})") from exc


def nests_within(value, max_depth: int) -> bool:
    """True when `value` nests at most `max_depth` lists or objects deep (level by level: never recursion)."""
    try:
        bounded_json.check(value, max_depth)
    except bounded_json.TooDeep:
        return False
    return True


def text_of(value, limit: int | None = None) -> str:
    """Any parsed value as text for a person: a string as it is, anything else as its JSON."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (ValueError, TypeError):  # no RecursionError: every value here passed the depth bound
            text = f"({type(value).__name__})"
    return shorten(text, limit) if limit else text


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def decoded(raw) -> str:
    """Bytes read from Redis as text, a byte that is not UTF-8 replaced (never an error)."""
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)


# -- fields -----------------------------------------------------------------------------------------


def number(value) -> float | None:
    """A time or a duration: a finite number within MAX_NUMBER, else None (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return value if math.isfinite(value) and abs(value) <= MAX_NUMBER else None


def count(value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_COUNT:
        return None
    return value


def token_count(value) -> int | None:
    """A token count, as a provider reports one or the store holds it: a whole number from 0 to
    MAX_COUNT, else None (unknown). A count such as 1e29 is no count, and would overflow what reads
    it later (an OTLP export carries 64-bit integers)."""
    found = count(value)
    return found if found is not None and found >= 0 else None


def usage(value) -> dict | None:
    """A model call's tokens, each a token_count; None when it says neither."""
    if not isinstance(value, dict):
        return None
    fixed = {"input_tokens": token_count(value.get("input_tokens")),
             "output_tokens": token_count(value.get("output_tokens"))}
    if fixed == {"input_tokens": None, "output_tokens": None}:
        return None
    if "cached_input_tokens" in value:
        fixed["cached_input_tokens"] = token_count(value.get("cached_input_tokens"))
    return fixed


_SPEND_COUNTS = ("tokens", "budget_tokens", "reserve_tokens", "in_flight_tokens")
_SPEND_PUSD = ("pusd", "in_flight_pusd")
_SPEND_MONEY = ("usd", "budget_usd", "reserve_usd")
MAX_PUSD = 10**18  # picodollars: a million dollars, past any turn's spend


def pusd(value) -> int | None:
    """An amount in picodollars: a whole number from 0 to MAX_PUSD, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PUSD:
        return None
    return value


def spend(value) -> dict | None:
    """A turn's spend (agent/spend.py), each count a token_count, each amount a number; None when it is none."""
    if not isinstance(value, dict):
        return None
    fixed = {name: token_count(value.get(name)) for name in _SPEND_COUNTS}
    fixed.update({name: pusd(value.get(name)) for name in _SPEND_PUSD})
    fixed.update({name: number(value.get(name)) for name in _SPEND_MONEY})
    if fixed["tokens"] is None:
        return None
    fixed["in_flight_tokens"] = fixed["in_flight_tokens"] or 0
    fixed["in_flight_pusd"] = fixed["in_flight_pusd"] or 0
    fixed["checked"] = text_of(value.get("checked") or "before each call")
    return fixed


def _text_or_none(value) -> str | None:
    return None if value is None else text_of(value)


def error(value) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return {"kind": UNREADABLE_KIND, "message": f"(unreadable error: {text_of(value, SHOWN_CHARS)})"}
    return {**value, "kind": text_of(value.get("kind") or ""), "message": text_of(value.get("message") or "")}


def current_step(value) -> dict | None:
    if not isinstance(value, dict):
        return None
    return {**value, "kind": _text_or_none(value.get("kind")), "name": text_of(value.get("name") or ""),
            "started_at": number(value.get("started_at")), "timeout_s": number(value.get("timeout_s"))}


def approval(value) -> dict | None:
    """A request for approval with each field of its type; None when it is not one (no id, name or expiry)."""
    if not isinstance(value, dict):
        return None
    fixed = {name: text_of(value.get(name) or "") for name in ("id", "call_id", "name", "arguments")}
    for name in ("asked_at", "expires_at", "answered_at"):
        fixed[name] = number(value.get(name))
    for name in ("answer", "answered_by", "job_id"):
        fixed[name] = _text_or_none(value.get(name)) or None
    fixed["steps_before"] = count(value.get("steps_before")) or 0
    return fixed if fixed["id"] and fixed["name"] and fixed["expires_at"] is not None else None


def _config(value) -> dict | None:
    return value if isinstance(value, dict) else None


_TIMES = ("deadline_at", "job_timeout_at", "updated_at", "started_at", "enqueued_at", "ended_at")


def doc(value) -> dict:
    """The small fields of the meta hash's `doc`, each of its type (None where it was not)."""
    fixed = dict(value)
    fixed["status"] = text_of(value.get("status") or Status.QUEUED)
    fixed["error"] = error(value.get("error"))
    fixed["current_step"] = current_step(value.get("current_step"))
    fixed["config"] = _config(value.get("config"))
    fixed["job_id"] = _text_or_none(value.get("job_id"))
    fixed["approval"] = approval(value.get("approval"))
    fixed["spend"] = spend(value.get("spend"))
    attempt = value.get("attempt")
    fixed["attempt"] = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0 else 0
    for name in _TIMES:
        fixed[name] = number(value.get(name))
    return fixed


# -- list items -------------------------------------------------------------------------------------


def message(raw) -> dict:
    """One history item: the message, its wrong-typed fields fixed; or a placeholder showing what was stored."""
    try:
        value = parse_json(raw)
    except Malformed as exc:
        return _unreadable_message(raw, str(exc))
    if not isinstance(value, dict) or not isinstance(value.get("role"), str) or value["role"] not in ROLES:
        return _unreadable_message(raw, "not a message")
    fixed = dict(value)
    if "content" in value:
        fixed["content"] = _text_or_none(value["content"])
    if "tool_call_id" in value:
        fixed["tool_call_id"] = text_of(value["tool_call_id"])
    if "tool_calls" in value:
        calls = value["tool_calls"] if isinstance(value["tool_calls"], list) else []
        fixed["tool_calls"] = [_tool_call(call) for call in calls if isinstance(call, dict)]
    return fixed


def _tool_call(call: dict) -> dict:
    """A tool call with its wrong-typed fields as text (a missing name or arguments empty); a well-formed
    one comes back equal, field for field (the job compares what it wrote with what it reads back)."""
    fixed = {**call, **{k: text_of(call[k]) for k in ("id", "type") if k in call and not isinstance(call[k], str)}}
    function = call.get("function", {})
    if not isinstance(function, dict):
        function = {"arguments": function}
    fixed["function"] = {"name": "", "arguments": "", **function, **{
        k: text_of(function[k]) for k in ("name", "arguments") if k in function and not isinstance(function[k], str)}}
    return fixed


def _unreadable_message(raw, why: str) -> dict:
    return {"role": Role.ASSISTANT,
            "content": f"(A stored message could not be read, {why}. What was stored: "
                       f"{shorten(decoded(raw))})"}


_STEP_TEXTS = ("detail", "arguments", "result", "unstreamed", "answered_by")
_STEP_COUNTS = ("attempt", "tool_calls", "refused_calls", "not_run_calls", "turns_not_sent", "partial_chars",
                "input_bound", "max_tokens", "cost_tokens")
_STEP_NUMBERS = ("started_at", "ended_at", "timeout_s", "remaining_s", "duration_s")


def step(raw, turn_id: str | None) -> dict:
    """One step, its wrong-typed fields fixed; or a placeholder (a failed tool step showing what was
    stored) counted in `turn_id`, the turn of the step before it."""
    try:
        value = parse_json(raw)
    except Malformed as exc:
        return _unreadable_step(raw, str(exc), turn_id)
    if not isinstance(value, dict):
        return _unreadable_step(raw, "not a step", turn_id)
    fixed = dict(value)
    fixed["turn_id"] = value["turn_id"] if isinstance(value.get("turn_id"), str) else (turn_id or "")
    fixed["index"] = count(value.get("index")) or 0
    fixed["kind"] = text_of(value.get("kind") or "")
    fixed["name"] = text_of(value.get("name") or "")
    fixed["outcome"] = text_of(value.get("outcome") or Outcome.ERROR)
    for name in _STEP_NUMBERS:
        fixed[name] = number(value.get(name))
    for name in _STEP_TEXTS:
        if name in value:
            fixed[name] = text_of(value[name])
    for name in _STEP_COUNTS:
        if name in value:
            fixed[name] = count(value[name])
    for name in ("kept_s", "deadline_at", "job_timeout_at", "cost_usd"):  # where a step has them (approvals, model)
        if name in value:
            fixed[name] = number(value[name])
    for name in ("last_call", "cost_worst"):
        if name in value:
            fixed[name] = value[name] is True
    if "usage" in value:
        fixed["usage"] = usage(value["usage"])
    return fixed


def _unreadable_step(raw, why: str, turn_id: str | None) -> dict:
    return {"turn_id": turn_id or "", "index": 0, "kind": Kind.TOOL, "name": "unreadable step",
            "started_at": None, "ended_at": None, "timeout_s": None, "remaining_s": None,
            "outcome": Outcome.ERROR, "duration_s": None, "arguments": "",
            "result": f"(A stored step could not be read, {why}. What was stored: {shorten(decoded(raw))})"}


def summary(raw) -> dict:
    """One ended turn's summary, its wrong-typed fields fixed; or a placeholder that says it could not be read."""
    try:
        value = parse_json(raw)
    except Malformed as exc:
        return _unreadable_summary(raw, str(exc))
    if not isinstance(value, dict):
        return _unreadable_summary(raw, "not a turn summary")
    fixed = dict(value)
    fixed["turn_id"] = text_of(value.get("turn_id") or "")
    fixed["status"] = text_of(value.get("status") or Status.FAILED)
    fixed["error"] = error(value.get("error"))
    fixed["config"] = _config(value.get("config"))
    if "spend" in value:
        fixed["spend"] = spend(value.get("spend"))
    for name in ("enqueued_at", "started_at", "deadline_at", "job_timeout_at", "ended_at"):
        fixed[name] = number(value.get(name))
    return fixed


def _unreadable_summary(raw, why: str) -> dict:
    message_text = f"This turn's record could not be read, {why}. What was stored: {shorten(decoded(raw))}"
    return {"turn_id": "", "status": Status.FAILED, "error": {"kind": UNREADABLE_KIND, "message": message_text},
            "enqueued_at": None, "started_at": None, "deadline_at": None, "job_timeout_at": None,
            "ended_at": None, "config": None}


# -- the whole state --------------------------------------------------------------------------------


def version(conversation_id: str, raw) -> int:
    """The meta hash's version, or UnreadableState."""
    text = decoded(raw)
    if not _VERSION_RE.fullmatch(text):
        raise UnreadableState(conversation_id, f"its version is not a whole number ({shorten(text, 40)!r})")
    return int(text)


def state(conversation_id: str, meta: dict, history: list, steps: list, turns: list) -> State:
    """The state contract's object from the raw values the store read; UnreadableState when the meta is not one."""
    meta = {decoded(k): v for k, v in meta.items()}
    number_of_version = version(conversation_id, meta.get("version", b""))
    done = decoded(meta.get("done", b""))
    if done not in ("0", "1"):
        raise UnreadableState(conversation_id, f"whether its turn has ended is not recorded ({shorten(done, 40)!r})")
    turn_id = meta.get("turn_id")
    if turn_id is None or not decoded(turn_id):
        raise UnreadableState(conversation_id, "it names no turn")
    try:
        small = parse_json(meta.get("doc") or b"")
    except Malformed as exc:
        raise UnreadableState(conversation_id, f"its turn's fields are {exc}") from None
    if not isinstance(small, dict):
        raise UnreadableState(conversation_id, "its turn's fields are not a JSON object")
    fixed_steps, last_turn = [], decoded(turn_id)  # a malformed step counts in the turn of the one before
    for raw in steps:
        fixed = step(raw, last_turn)
        last_turn = fixed["turn_id"] or last_turn
        fixed_steps.append(fixed)
    return make_state(conversation_id, decoded(turn_id), number_of_version, done == "1", doc(small),
                      [message(m) for m in history], fixed_steps, [summary(t) for t in turns])
