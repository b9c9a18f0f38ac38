"""The conversation state in Redis: versions, TTL, one turn at a time. The object it reads back
is the state contract (agent/contract.py).

Layout per conversation (all keys share one TTL, refreshed on every write):

    agent:conv:{id}:meta     hash: turn_id, done, version, doc (JSON of the small fields)
    agent:conv:{id}:history  list: one JSON message per item, append-only
    agent:conv:{id}:steps    list: one JSON step per item, append-only
    agent:conv:{id}:turns    list: one JSON summary per ended turn
    agent:conv:{id}:events   stream: one tiny entry per write, id `<version>-1`, so a client can
                             block until the version moves instead of sleeping a poll interval
    agent:conv:{id}:live     string: the text a model call is writing now (UTF-8), grown by APPEND;
                             its head (turn, message index, attempt, status, seq) is `live` in meta

The live text is append-only while the same text (same seq) continues, so a reader that has its
first N bytes fetches only the rest (GETRANGE from N). The publish that appends the completed
message, or records the cut call's step, clears it in the same script; `live_ended` in meta is the
last seq cleared, so a late live write for a text already ended is refused.

A poll that finds no change is one HGET of `version`; a publish appends only what is new.
Every write goes through a Lua script that refuses it when the turn is not the current one,
when the turn has already ended (done never reverts), or when the history moved underneath.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import TypedDict

import redis

from agent.contract import LIST_FIELDS, Live, Message, State, Step, TurnDoc, TurnSummary, make_state
from agent.surrogates import scrub

KEY_PREFIX = "agent:"
MAX_BLOCK_MS = 1500  # a blocking read stays under the state client's 2 s socket timeout
# A conversation id names Redis keys and goes in URLs and command lines: letters, digits, '-' and '_'.
CONVERSATION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

_BEGIN = """
local meta, history, turns, steps, events, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local turn_id, message, doc, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local current = redis.call('HMGET', meta, 'turn_id', 'done')
if current[1] then
  if current[1] == turn_id then return {'same', redis.call('HGET', meta, 'version')} end
  if current[2] == '0' then return {'busy', current[1]} end
end
redis.call('RPUSH', history, message)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'turn_id', turn_id, 'done', '0', 'doc', doc)
redis.call('HDEL', meta, 'live', 'live_seq', 'live_ended')
redis.call('DEL', live)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, history, turns, steps, events}) do redis.call('EXPIRE', key, ttl) end
return {'ok', tostring(version)}
"""

_PUBLISH = """
local meta, history, steps, turns, events, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local turn_id, expected_len, doc, done, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local n_messages, n_steps = tonumber(ARGV[6]), tonumber(ARGV[7])
local summary, end_live = ARGV[8], tonumber(ARGV[9])
local current = redis.call('HMGET', meta, 'turn_id', 'done')
if not current[1] then return redis.error_reply('GONE the conversation has expired') end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
if expected_len >= 0 and redis.call('LLEN', history) ~= expected_len then
  return redis.error_reply('CONFLICT the history moved')
end
local i = 10
for _ = 1, n_messages do redis.call('RPUSH', history, ARGV[i]); i = i + 1 end
for _ = 1, n_steps do redis.call('RPUSH', steps, ARGV[i]); i = i + 1 end
if summary ~= '' then redis.call('RPUSH', turns, summary) end
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'done', done, 'doc', doc)
if end_live > 0 then
  local ended = tonumber(redis.call('HGET', meta, 'live_ended') or '0')
  if end_live > ended then redis.call('HSET', meta, 'live_ended', end_live) end
end
local live_seq = tonumber(redis.call('HGET', meta, 'live_seq') or '0')
if done == '1' or (live_seq > 0 and live_seq <= end_live) then
  redis.call('HDEL', meta, 'live', 'live_seq')
  redis.call('DEL', live)
end
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, history, steps, turns, events, live}) do redis.call('EXPIRE', key, ttl) end
return version
"""

# The live text's write: refused like a publish (GONE, STALE, CLOSED); 'ended' once its text was
# cleared (a late write); 'lag' when an append does not start where the stored text ends (an earlier
# write was lost), so the writer sends the whole text instead.
_LIVE = """
local meta, live, events = KEYS[1], KEYS[2], KEYS[3]
local turn_id, ttl, head, seq, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
local from, text = tonumber(ARGV[6]), ARGV[7]
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'live_seq', 'live_ended')
if not current[1] then return redis.error_reply('GONE the conversation has expired') end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
-- Ended, or older than the text Redis holds (a write that stalled while a retry started a fresh text).
if seq <= tonumber(current[4] or '0') or seq < tonumber(current[3] or '0') then return {'ended', 0} end
if mode == 'append' then
  if tonumber(current[3] or '0') ~= seq or redis.call('STRLEN', live) ~= from then return {'lag', 0} end
  redis.call('APPEND', live, text)
else
  redis.call('SET', live, text)
end
redis.call('HSET', meta, 'live', head, 'live_seq', seq)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
return {'ok', version}
"""


def is_conversation_id(value) -> bool:
    """The one rule for an id that comes from outside (the page's URL, the CLI's --conversation).

    A whole match: `re.match` with `$` would also take an id followed by a newline."""
    return isinstance(value, str) and CONVERSATION_ID_RE.fullmatch(value) is not None


class LiveHead(TypedDict):
    """What meta keeps of a live text (the contract's `live` without its text), and its per-turn seq."""

    turn_id: str
    message_index: int
    attempt: int
    status: str
    seq: int  # 1, 2, ... per turn: one per model call attempt that wrote text


class StoreError(Exception):
    """A write was refused; `reason` is GONE, STALE, CLOSED or CONFLICT."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class TurnInFlight(Exception):
    """The conversation already has a turn in flight; a new message is refused, not queued."""

    def __init__(self, conversation_id: str, turn_id: str):
        super().__init__("a reply is still being written in this conversation: wait for it, or stop it")
        self.conversation_id = conversation_id
        self.turn_id = turn_id


@dataclass(frozen=True)
class Keys:
    meta: str
    history: str
    steps: str
    turns: str
    events: str
    live: str

    @classmethod
    def of(cls, conversation_id: str) -> Keys:
        base = f"{KEY_PREFIX}conv:{conversation_id}:"
        return cls(base + "meta", base + "history", base + "steps", base + "turns", base + "events", base + "live")


def _dumps(value) -> str:
    # A lone surrogate that got this far (a tool's output, a quoted error) would make Redis's
    # UTF-8 encoding fail and lose the whole write: it is written as U+FFFD instead.
    return scrub(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


class Store:
    def __init__(self, client: redis.Redis, ttl_s: int):
        self.redis = client
        self.ttl_s = ttl_s
        self._begin = client.register_script(_BEGIN)
        self._publish = client.register_script(_PUBLISH)
        self._live = client.register_script(_LIVE)

    # -- readers ---------------------------------------------------------------------------

    def version(self, conversation_id: str) -> int | None:
        """The cheap poll: one small read."""
        raw = self.redis.hget(Keys.of(conversation_id).meta, "version")
        return int(raw) if raw is not None else None

    def wait_version(self, conversation_id: str, seen: int | None, timeout_ms: int) -> int | None:
        """Block until the version is past `seen` (or the timeout), then return the version.

        One blocking read on the conversation's event stream: a client wakes within
        milliseconds of a write instead of up to a whole poll interval later."""
        keys = Keys.of(conversation_id)
        timeout_ms = max(1, min(int(timeout_ms), MAX_BLOCK_MS))
        after = f"{seen}-1" if seen else "0-0"
        self.redis.xread({keys.events: after}, count=1, block=timeout_ms)
        return self.version(conversation_id)

    def read(self, conversation_id: str) -> State | None:
        """The whole state object of the contract, or None when unknown or expired."""
        keys = Keys.of(conversation_id)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.lrange(keys.history, 0, -1)
            pipe.lrange(keys.steps, 0, -1)
            pipe.lrange(keys.turns, 0, -1)
            pipe.get(keys.live)
            meta, history, steps, turns, live_text = pipe.execute()
        if not meta:
            return None
        return _state(conversation_id, meta, history, steps, turns, live_text)

    def read_since(self, conversation_id: str, known: State | None) -> State | None:
        """The whole state object, fetching only what was appended since `known` (an earlier read).

        History, steps and turn summaries are append-only, so a client that follows a turn reads
        the small fields and the new tail of each list: O(new), not O(conversation). So is the live
        text while the same text continues: only the bytes past the ones `known` holds are fetched."""
        if not known:
            return self.read(conversation_id)
        keys = Keys.of(conversation_id)
        lists = (keys.history, keys.steps, keys.turns)
        have = [len(known[name]) for name in LIST_FIELDS]
        known_live = known.get("live")
        have_bytes = len(known_live["text"].encode()) if known_live else 0
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            for key, start in zip(lists, have, strict=True):
                pipe.llen(key)
                pipe.lrange(key, start, -1)
            pipe.strlen(keys.live)
            pipe.getrange(keys.live, have_bytes, -1)
            meta, n_history, history, n_steps, steps, n_turns, turns, n_live, live_tail = pipe.execute()
        if not meta:
            return None
        if [n_history, n_steps, n_turns] != [a + len(b) for a, b in zip(have, (history, steps, turns), strict=True)]:
            return self.read(conversation_id)  # not the lists `known` was read from (expired, re-created)
        fresh = _state(conversation_id, meta, history, steps, turns, live_tail)
        live = fresh["live"]
        if live is not None and have_bytes:
            if not _same_text(live, known_live) or n_live < have_bytes:
                # Another text than the one `known` holds the start of: read this one whole.
                return self.read_since(conversation_id, {**known, "live": None})
            live["text"] = known_live["text"] + live["text"]
        for name in LIST_FIELDS:
            fresh[name] = known[name] + fresh[name]
        return fresh

    def read_meta(self, conversation_id: str) -> State | None:
        """The small fields only (no history, steps or live text)."""
        meta = self.redis.hgetall(Keys.of(conversation_id).meta)
        if not meta:
            return None
        state = _state(conversation_id, meta, [], [], [])
        state["live"] = None
        return state

    # -- writers ---------------------------------------------------------------------------

    def begin_turn(
        self, conversation_id: str, turn_id: str, user_message: Message, doc: TurnDoc, *, ttl_s: int | None = None
    ) -> tuple[bool, int]:
        """Append the user's message and mark the turn queued. Returns (new, version).

        `ttl_s` (default: the store's) is the conversation's TTL while the turn waits for a worker.

        The same turn id again (a double submit) is not a new turn; a different one while a
        turn is in flight raises TurnInFlight.
        """
        keys = Keys.of(conversation_id)
        doc = {**doc, "updated_at": time.time()}
        outcome, value = self._begin(
            keys=[keys.meta, keys.history, keys.turns, keys.steps, keys.events, keys.live],
            args=[turn_id, _dumps(user_message), _dumps(doc), ttl_s or self.ttl_s],
        )
        outcome = outcome.decode() if isinstance(outcome, bytes) else outcome
        value = value.decode() if isinstance(value, bytes) else value
        if outcome == "busy":
            raise TurnInFlight(conversation_id, value)
        return outcome == "ok", int(value)

    def publish(
        self,
        conversation_id: str,
        turn_id: str,
        doc: TurnDoc,
        *,
        done: bool = False,
        new_messages: list[Message] = (),
        new_steps: list[Step] = (),
        expected_history_len: int = -1,
        summary: TurnSummary | None = None,
        end_live: int = 0,
    ) -> int:
        """One atomic write: append what is new, replace the small fields, bump the version.

        `end_live` (a live text's seq, 0 for none) clears that live text in the same write, and refuses
        any later live write for it; an ending (done) clears whatever live text there is."""
        keys = Keys.of(conversation_id)
        doc = {**doc, "updated_at": time.time()}
        args = [
            turn_id,
            expected_history_len,
            _dumps(doc),
            "1" if done else "0",
            self.ttl_s,
            len(new_messages),
            len(new_steps),
            _dumps(summary) if summary else "",
            end_live,
            *(_dumps(m) for m in new_messages),
            *(_dumps(s) for s in new_steps),
        ]
        try:
            return int(self._publish(keys=[keys.meta, keys.history, keys.steps, keys.turns, keys.events, keys.live],
                                     args=args))
        except redis.ResponseError as exc:
            raise _refusal(exc) from exc

    def write_live(self, conversation_id: str, turn_id: str, head: LiveHead, text: str, *,
                   from_bytes: int | None = None) -> str:
        """Write the live text: the whole of it, or (`from_bytes`) the part that follows the stored
        text's first `from_bytes` bytes. Returns "ok", "ended" (its text was already cleared: nothing
        written) or "lag" (the stored text does not end at `from_bytes`: nothing written)."""
        keys = Keys.of(conversation_id)
        args = [turn_id, self.ttl_s, _dumps(head), head["seq"], "whole" if from_bytes is None else "append",
                from_bytes or 0, scrub(text)]
        try:
            outcome, _ = self._live(keys=[keys.meta, keys.live, keys.events, keys.history, keys.steps, keys.turns],
                                    args=args)
        except redis.ResponseError as exc:
            raise _refusal(exc) from exc
        return _text(outcome)

    def history_since(self, conversation_id: str, start: int) -> list[Message]:
        """The messages from index `start` on."""
        return [json.loads(m) for m in self.redis.lrange(Keys.of(conversation_id).history, start, -1)]

    def history_len(self, conversation_id: str) -> int:
        return int(self.redis.llen(Keys.of(conversation_id).history))

    # -- per-turn flags --------------------------------------------------------------------

    def claim_turn(self, turn_id: str, job_id: str, ttl_s: int) -> bool:
        """The first job to run a turn claims it; a duplicate or a re-run finds it taken."""
        return bool(self.redis.set(f"{KEY_PREFIX}turn:{turn_id}:claim", job_id, nx=True, ex=ttl_s))

    def request_cancel(self, turn_id: str, ttl_s: int) -> None:
        self.redis.set(f"{KEY_PREFIX}turn:{turn_id}:cancel", "1", ex=ttl_s)

    def cancel_requested(self, turn_id: str) -> bool:
        return bool(self.redis.exists(f"{KEY_PREFIX}turn:{turn_id}:cancel"))


def _refusal(exc: redis.ResponseError) -> Exception:
    reason, _, message = str(exc).partition(" ")
    if reason in ("GONE", "STALE", "CLOSED", "CONFLICT"):
        return StoreError(reason, message)
    return exc


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _same_text(a: Live, b: Live) -> bool:
    return (a["turn_id"], a["message_index"], a["attempt"]) == (b["turn_id"], b["message_index"], b["attempt"])


def _live(head_json: str | None, text) -> Live | None:
    if not head_json:
        return None
    head = json.loads(head_json)
    return Live(turn_id=head["turn_id"], message_index=head["message_index"], attempt=head["attempt"],
                text=_text(text or b""), status=head["status"])


def _state(conversation_id: str, meta: dict, history: list, steps: list, turns: list, live_text=None) -> State:
    meta = {_text(k): _text(v) for k, v in meta.items()}
    return make_state(
        conversation_id,
        meta.get("turn_id"),
        int(meta.get("version", 0)),
        meta.get("done") == "1",
        json.loads(meta.get("doc") or "{}"),
        [json.loads(m) for m in history],
        [json.loads(s) for s in steps],
        [json.loads(t) for t in turns],
        _live(meta.get("live"), live_text),
    )
