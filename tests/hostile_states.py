"""Hostile conversation states for tests: a real state (written with the Store API), then one part of it
overwritten straight in Redis with what no client of this project writes, from a seeded RNG.

Each case says whether the result must read as a (repaired) state or as unreadable: the meta hash's
`version`, `done`, `turn_id` and `doc`, and keys of the wrong kind, make it unreadable; anything in
the lists, and wrong types inside `doc`, must read as a well-formed state.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rq import Queue

from agent.contract import turn_summary
from agent.conversation.keys import Keys
from agent.conversation.store import Store
from agent.conversation.well_formed import MAX_DEPTH, MAX_NUMBER, ROLES, nests_within
from agent.queue import job_id_for, new_id, submit_turn
from agent.settings import TurnConfig


def deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# Raw JSON texts of values that no field of the contract holds (NaN, 1e999 and a 400-digit integer
# are JSON that Python reads; the nests pass the C scanner's own limit or not).
WRONG_VALUES = [
    "null", "true", "false", "0", "-7", "1e308", "-1e308", "9" * 400, "1e999", "NaN", "-Infinity",
    '""', '"text"', '"\\u001b]0;retitled\\u0007\\u001b[2J"', '"<script>alert(1)</script>"',
    '"C:\\\\x\\n  File \\"/etc\\""',
    "[]", "{}", "[1, [2, [3]]]", '{"role": {"nested": true}}', '[{"function": 5}]',
    deep_list(40), deep_list(1000), deep_object(1000), deep_list(20000), deep_object(20000),
]
NOT_JSON = ["", "{", "not json", '{"role": "user", "content": "x"', "\x00", deep_list(1000)[:-1], "1" * 5000,
            "{'a': 1}"]
NOT_UTF8 = [b"\xff\xfe{", b'{"role": "user", "content": "\xc3\x28"}']

HISTORY_FIELDS = ("role", "content", "tool_calls", "tool_call_id")
STEP_FIELDS = ("turn_id", "index", "kind", "name", "started_at", "ended_at", "timeout_s", "remaining_s", "outcome",
               "duration_s", "attempt", "last_call", "tool_calls", "detail", "arguments", "result", "refused_calls",
               "not_run_calls", "answered_by", "deadline_at", "job_timeout_at")
SUMMARY_FIELDS = ("turn_id", "status", "error", "enqueued_at", "started_at", "deadline_at", "job_timeout_at",
                  "ended_at", "config")
DOC_FIELDS = ("status", "error", "config", "job_id", "enqueued_at", "started_at", "deadline_at", "job_timeout_at",
              "current_step", "ended_at", "updated_at", "approval")

READABLE_KINDS = ("history_item", "history_field", "tool_call_field", "step_item", "step_field", "turn_item",
                  "turn_field", "doc_field")
UNREADABLE_KINDS = ("meta_version", "meta_done", "meta_turn_id", "meta_doc", "wrong_key_type")


@dataclass
class Case:
    number: int
    kind: str
    base: str  # the status of the real state it was made from
    cid: str
    detail: str  # what was written, shortened, for a failure message

    nested_too_deep: bool = False  # what was written nests deeper than MAX_DEPTH

    @property
    def unreadable(self) -> bool:
        # The small fields must parse as one object; a too-deep one cannot be repaired field by field.
        return self.kind in UNREADABLE_KINDS or (self.kind == "doc_field" and self.nested_too_deep)

    def __str__(self) -> str:
        return f"case {self.number} ({self.kind} on a {self.base} state): {self.detail}"


def _object_text(value: dict, raw: dict[str, str], missing: tuple[str, ...] = ()) -> str:
    """A JSON object: `value`'s fields as JSON, those in `raw` as the raw texts given, `missing` left out."""
    parts = [f"{json.dumps(k)}:{json.dumps(v)}" for k, v in value.items() if k not in raw and k not in missing]
    parts += [f"{json.dumps(k)}:{text}" for k, text in raw.items()]
    return "{" + ",".join(parts) + "}"


def _wrong_fields(rng: random.Random, value: dict, fields: tuple[str, ...]) -> str:
    chosen = rng.sample(fields, rng.randint(1, min(3, len(fields))))
    missing = tuple(f for f in chosen if rng.random() < 0.25)  # a missing field is a wrong one too
    return _object_text(value, {f: rng.choice(WRONG_VALUES) for f in chosen if f not in missing}, missing)


def _whole_item(rng: random.Random):
    pool = rng.choice((WRONG_VALUES, NOT_JSON, NOT_UTF8))
    return rng.choice(pool)


def base_state(store: Store, status: str, queue: Queue | None = None) -> tuple[str, str]:
    """A real conversation: one ended turn with a tool step, then the latest turn in `status`. With a
    `queue` (and no worker on it), the latest turn's job waits there, so a turn in flight stays in
    flight (without, its job is missing and a front end soon writes its ending, as for a lost worker)."""
    cid = new_id()
    _turn(store, cid, "done")
    turn_id = _turn(store, cid, status, queue)
    return cid, turn_id


def _turn(store: Store, cid: str, status: str, queue: Queue | None = None) -> str:
    now = time.time()
    if queue is not None:
        turn_id = submit_turn(store, queue, cid, "What is 17*23?", TurnConfig(provider="demo", model="demo"))
    else:
        turn_id = new_id()
    doc = {"status": "queued", "error": None, "config": {"provider": "demo", "job_timeout_s": 6},
           "job_id": job_id_for(turn_id), "enqueued_at": now, "deadline_at": None, "job_timeout_at": None,
           "started_at": None, "current_step": None, "attempt": 0}
    if queue is None:
        store.begin_turn(cid, turn_id, {"role": "user", "content": "What is 17*23?"}, doc)
    if status == "queued":
        return turn_id
    # Its clocks far off: a turn in flight is not taken for lost while a test looks at it.
    doc.update(status="running", started_at=now, deadline_at=now + 60, job_timeout_at=now + 120,
               current_step={"kind": "model", "name": "demo", "started_at": now, "timeout_s": 3.0})
    function = {"name": "calculator", "arguments": '{"expression": "17*23"}'}
    call = {"id": "call_1", "type": "function", "function": function}
    steps = [
        {"turn_id": turn_id, "index": 1, "kind": "model", "name": "demo", "started_at": now, "ended_at": now + 0.1,
         "timeout_s": 3.0, "remaining_s": 4.0, "outcome": "ok", "duration_s": 0.1, "attempt": 1, "tool_calls": 1},
        {"turn_id": turn_id, "index": 2, "kind": "tool", "name": "calculator", "started_at": now + 0.1,
         "ended_at": now + 0.2, "timeout_s": 3.0, "remaining_s": 3.9, "outcome": "ok", "duration_s": 0.1,
         "arguments": '{"expression": "17*23"}', "result": "391"},
    ]
    store.publish(cid, turn_id, doc, new_messages=[{"role": "assistant", "content": None, "tool_calls": [call]},
                                                   {"role": "tool", "tool_call_id": "call_1", "content": "391"}],
                  new_steps=steps)
    if status == "running":
        return turn_id
    doc.update(status=status, current_step=None, ended_at=now + 0.3,
               error=None if status == "done" else {"kind": "deadline", "message": f"It ended {status}."})
    store.publish(cid, turn_id, doc, done=True, new_messages=[{"role": "assistant", "content": "**17*23 = 391**"}],
                  summary=turn_summary(turn_id, doc, now + 0.3))
    return turn_id


def make_case(store: Store, rng: random.Random, number: int, kind: str | None = None,
              queue: Queue | None = None) -> Case:
    """One hostile state in Redis, from `rng` (its latest turn's job waiting in `queue`, if given)."""
    kind = kind or rng.choice(READABLE_KINDS * 2 + UNREADABLE_KINDS)
    base = rng.choice(("done", "running", "queued", "failed"))
    cid, _ = base_state(store, base, queue)
    raw = damage(store, rng, cid, kind)
    shown = raw if isinstance(raw, str) else raw.decode("latin-1")
    deep = "[" * (MAX_DEPTH + 1) in shown or '{"a":' * (MAX_DEPTH + 1) in shown
    return Case(number, kind, base, cid, shown if len(shown) < 120 else f"{shown[:100]}… ({len(shown)} chars)", deep)


def stored_items(store: Store, cid: str, family: str) -> list[str]:
    """The fields of the conversation's tree (agent/conversation/scripts/included/tree.lua) that hold its shown
    path's items of one family ("history", "step" or "turn"), in the order the state reads them."""
    tree = Keys.of(cid).tree
    path, turn = [], (store.redis.hget(Keys.of(cid).meta, "tip") or b"").decode()
    while turn:
        path.insert(0, turn)
        turn = (store.redis.hget(tree, f"{turn}:parent") or b"").decode()
    fields = []
    for turn in path:
        if family == "turn":
            fields += [f"{turn}:sum"] if store.redis.hexists(tree, f"{turn}:sum") else []
        else:
            letter, count = ("m", "n") if family == "history" else ("s", "s")
            fields += [f"{turn}:{letter}:{i}" for i in range(int(store.redis.hget(tree, f"{turn}:{count}") or 0))]
    return fields


def overwrite(store: Store, cid: str, field: str, raw) -> None:
    """Write `raw` in place of one field of the conversation's tree, and move its turn's version on as the
    store's writes do: readers keep a turn they have read by its version (agent/conversation/reads.py)."""
    tree = Keys.of(cid).tree
    store.redis.hset(tree, field, raw)
    store.redis.hincrby(tree, f"{field.split(':', 1)[0]}:v", 1)


def damage(store: Store, rng: random.Random, cid: str, kind: str) -> str | bytes:
    """Overwrite one part of conversation `cid` in Redis as `kind` says; returns what was written."""
    keys, r = Keys.of(cid), store.redis
    family = kind.split("_", 1)[0]
    if kind.endswith("_item"):
        raw = _whole_item(rng)
        overwrite(store, cid, rng.choice(stored_items(store, cid, family)), raw)
    elif kind in ("history_field", "step_field", "turn_field", "tool_call_field"):
        fields = stored_items(store, cid, "history" if kind == "tool_call_field" else family)
        items = r.hmget(keys.tree, fields)
        index = rng.randrange(len(items))
        value = json.loads(items[index])
        if kind == "tool_call_field":
            index = next(i for i, m in enumerate(items) if b"tool_calls" in m)
            value = json.loads(items[index])
            call = value["tool_calls"][0]
            function = _wrong_fields(rng, call["function"], ("name", "arguments"))
            raw = _object_text(value, {"tool_calls": "[" + _object_text(call, {"function": function}) + "]"})
        else:
            wrong = {"history": HISTORY_FIELDS, "step": STEP_FIELDS, "turn": SUMMARY_FIELDS}[family]
            raw = _wrong_fields(rng, value, wrong)
        overwrite(store, cid, fields[index], raw)
    elif kind == "doc_field":
        raw = _wrong_fields(rng, json.loads(r.hget(keys.meta, "doc")), DOC_FIELDS)
        r.hset(keys.meta, "doc", raw)
    elif kind == "meta_version":
        raw = rng.choice(["abc", "1.5", "-3", "", "1e3", "9" * 30, " 7", "7\n", "\x1b[2J", "٣"])
        r.hset(keys.meta, "version", raw)
    elif kind == "meta_done":
        raw = rng.choice(["2", "yes", "", "true", "\x00"])
        r.hset(keys.meta, "done", raw)
    elif kind == "meta_turn_id":
        raw = "(removed)"
        r.hdel(keys.meta, "turn_id")
    elif kind == "meta_doc":
        raw = rng.choice([*NOT_JSON, *NOT_UTF8, "[]", "5", '"text"', "null", deep_object(MAX_DEPTH + 5),
                          deep_list(1000)])
        r.hset(keys.meta, "doc", raw)
    else:  # wrong_key_type
        key = rng.choice((keys.meta, keys.tree))
        raw = f"{key} as a string"
        r.delete(key)
        r.set(key, "hostile")
    return raw


def cases(store: Store, seed: int, count: int, queue: Queue | None = None) -> Iterator[Case]:
    """`count` cases, each written when the one before has been looked at."""
    rng = random.Random(seed)
    every_kind = [*READABLE_KINDS, *UNREADABLE_KINDS]  # each kind at least once, then at random
    for n in range(count):
        yield make_case(store, rng, n, every_kind[n] if n < len(every_kind) else None, queue)


# -- what a well-formed state is -------------------------------------------------------------------


def _is_number(value) -> bool:
    return value is None or (isinstance(value, float) and math.isfinite(value) and abs(value) <= MAX_NUMBER)


def _is_error(value) -> bool:
    return value is None or (isinstance(value, dict) and isinstance(value.get("kind"), str)
                             and isinstance(value.get("message"), str))


def assert_well_formed(state: dict, where: object = "") -> None:
    """Every field of the contract of its type, so that any reader can draw it."""
    assert isinstance(state["version"], int) and isinstance(state["done"], bool), where
    for name in ("conversation_id", "turn_id", "status"):
        assert isinstance(state[name], str), (name, where)
    assert _is_error(state["error"]), where
    for name in ("deadline_at", "job_timeout_at", "updated_at", "started_at", "enqueued_at"):
        assert _is_number(state[name]), (name, state[name], where)
    current = state["current_step"]
    assert current is None or (isinstance(current, dict) and isinstance(current["name"], str)
                               and _is_number(current["started_at"]) and _is_number(current["timeout_s"])
                               and (current["kind"] is None or isinstance(current["kind"], str))), where
    assert state["config"] is None or isinstance(state["config"], dict), where
    assert state["job_id"] is None or isinstance(state["job_id"], str), where
    for message in state["history"]:
        assert isinstance(message, dict) and message["role"] in ROLES, (message, where)
        assert message.get("content") is None or isinstance(message["content"], str), (message, where)
        for call in message.get("tool_calls", []):
            function = call["function"]
            assert isinstance(function["name"], str) and isinstance(function["arguments"], str), (call, where)
    for step in state["steps"]:
        assert isinstance(step, dict), where
        for name in ("turn_id", "kind", "name", "outcome"):
            assert isinstance(step[name], str), (name, step, where)
        assert isinstance(step["index"], int), where
        for name in ("started_at", "ended_at", "timeout_s", "remaining_s", "duration_s"):
            assert _is_number(step[name]), (name, step, where)
        for name in ("detail", "arguments", "result"):
            assert name not in step or isinstance(step[name], str), (name, step, where)
    for summary in state["turns"]:
        assert isinstance(summary["turn_id"], str) and isinstance(summary["status"], str), where
        assert _is_error(summary["error"]), where
        for name in ("enqueued_at", "started_at", "deadline_at", "job_timeout_at", "ended_at"):
            assert _is_number(summary[name]), (name, summary, where)
    assert nests_within(state, MAX_DEPTH + 3), where
    json.dumps(state, allow_nan=False)  # what `ask --json` prints is JSON
