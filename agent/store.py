"""The conversation state in Redis: versions, TTL, one turn at a time. The object it reads back
is the state contract (agent/contract.py).

Layout per conversation (all keys share one TTL, refreshed on every write):

    agent:conv:{id}:meta     hash: turn_id, done, version, doc (JSON of the small fields)
    agent:conv:{id}:history  list: one JSON message per item, append-only
    agent:conv:{id}:steps    list: one JSON step per item, append-only
    agent:conv:{id}:turns    list: one JSON summary per ended turn
    agent:conv:{id}:events   stream: one tiny entry per write, id `<version>-1`, so a client can
                             block until the version moves instead of sleeping a poll interval

A poll that finds no change is one HGET of `version`; a publish appends only what is new.
Every write goes through a Lua script that refuses it when the turn is not the current one,
when the turn has already ended (done never reverts), or when the history moved underneath.

Whatever the keys hold, a read returns a well-formed State or raises UnreadableState
(agent/well_formed.py holds the rule): never a JSON, type or recursion error.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import redis

from agent import well_formed
from agent.contract import LIST_FIELDS, Message, State, Step, TurnDoc, TurnSummary
from agent.surrogates import scrub
from agent.well_formed import UnreadableState

KEY_PREFIX = "agent:"
MAX_BLOCK_MS = 1500  # a blocking read stays under the state client's 2 s socket timeout
# A conversation id names Redis keys and goes in URLs and command lines: letters, digits, '-' and '_'.
CONVERSATION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

_BEGIN = """
local meta, history, turns, steps, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, message, doc, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'version')
-- A version that is not a whole number would fail HINCRBY below, after the message was appended.
if current[3] and not string.match(current[3], '^%d+$') then return {'unreadable', ''} end
if current[1] then
  if current[1] == turn_id then return {'same', current[3]} end
  if current[2] == '0' then return {'busy', current[1]} end
end
redis.call('RPUSH', history, message)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'turn_id', turn_id, 'done', '0', 'doc', doc)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, history, turns, steps, events}) do redis.call('EXPIRE', key, ttl) end
return {'ok', tostring(version)}
"""

_PUBLISH = """
local meta, history, steps, turns, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local turn_id, expected_len, doc, done, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local n_messages, n_steps = tonumber(ARGV[6]), tonumber(ARGV[7])
local summary = ARGV[8]
local current = redis.call('HMGET', meta, 'turn_id', 'done')
if not current[1] then return redis.error_reply('GONE the conversation has expired') end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
if expected_len >= 0 and redis.call('LLEN', history) ~= expected_len then
  return redis.error_reply('CONFLICT the history moved')
end
local i = 9
for _ = 1, n_messages do redis.call('RPUSH', history, ARGV[i]); i = i + 1 end
for _ = 1, n_steps do redis.call('RPUSH', steps, ARGV[i]); i = i + 1 end
if summary ~= '' then redis.call('RPUSH', turns, summary) end
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'done', done, 'doc', doc)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, history, steps, turns, events}) do redis.call('EXPIRE', key, ttl) end
return version
"""


def is_conversation_id(value) -> bool:
    """The one rule for an id that comes from outside (the page's URL, the CLI's --conversation).

    A whole match: `re.match` with `$` would also take an id followed by a newline."""
    return isinstance(value, str) and CONVERSATION_ID_RE.fullmatch(value) is not None


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

    @classmethod
    def of(cls, conversation_id: str) -> Keys:
        base = f"{KEY_PREFIX}conv:{conversation_id}:"
        return cls(base + "meta", base + "history", base + "steps", base + "turns", base + "events")


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

    # -- readers ---------------------------------------------------------------------------

    def version(self, conversation_id: str) -> int | None:
        """The cheap poll: one small read. UnreadableState when what is stored is not a version."""
        with _readable(conversation_id):
            raw = self.redis.hget(Keys.of(conversation_id).meta, "version")
        return well_formed.version(conversation_id, raw) if raw is not None else None

    def wait_version(self, conversation_id: str, seen: int | None, timeout_ms: int) -> int | None:
        """Block until the version is past `seen` (or the timeout), then return the version.

        One blocking read on the conversation's event stream: a client wakes within
        milliseconds of a write instead of up to a whole poll interval later."""
        keys = Keys.of(conversation_id)
        timeout_ms = max(1, min(int(timeout_ms), MAX_BLOCK_MS))
        after = f"{seen}-1" if seen else "0-0"
        with _readable(conversation_id):
            self.redis.xread({keys.events: after}, count=1, block=timeout_ms)
        return self.version(conversation_id)

    def read(self, conversation_id: str) -> State | None:
        """The whole state object of the contract, or None when unknown or expired."""
        keys = Keys.of(conversation_id)
        with _readable(conversation_id), self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.lrange(keys.history, 0, -1)
            pipe.lrange(keys.steps, 0, -1)
            pipe.lrange(keys.turns, 0, -1)
            meta, history, steps, turns = pipe.execute()
        if not meta:
            return None
        return _state(conversation_id, meta, history, steps, turns)

    def read_since(self, conversation_id: str, known: State | None) -> State | None:
        """The whole state object, fetching only what was appended since `known` (an earlier read).

        History, steps and turn summaries are append-only, so a client that follows a turn reads
        the small fields and the new tail of each list: O(new), not O(conversation)."""
        if not known:
            return self.read(conversation_id)
        keys = Keys.of(conversation_id)
        lists = (keys.history, keys.steps, keys.turns)
        have = [len(known[name]) for name in LIST_FIELDS]
        with _readable(conversation_id), self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            for key, start in zip(lists, have, strict=True):
                pipe.llen(key)
                pipe.lrange(key, start, -1)
            meta, n_history, history, n_steps, steps, n_turns, turns = pipe.execute()
        if not meta:
            return None
        if [n_history, n_steps, n_turns] != [a + len(b) for a, b in zip(have, (history, steps, turns), strict=True)]:
            return self.read(conversation_id)  # not the lists `known` was read from (expired, re-created)
        fresh = _state(conversation_id, meta, history, steps, turns)
        for name in LIST_FIELDS:
            fresh[name] = known[name] + fresh[name]
        return fresh

    def read_meta(self, conversation_id: str) -> State | None:
        """The small fields only (no history or steps)."""
        with _readable(conversation_id):
            meta = self.redis.hgetall(Keys.of(conversation_id).meta)
        if not meta:
            return None
        return _state(conversation_id, meta, [], [], [])

    # -- writers ---------------------------------------------------------------------------

    def begin_turn(
        self, conversation_id: str, turn_id: str, user_message: Message, doc: TurnDoc, *, ttl_s: int | None = None
    ) -> tuple[bool, int]:
        """Append the user's message and mark the turn queued. Returns (new, version).

        `ttl_s` (default: the store's) is the conversation's TTL while the turn waits for a worker.

        The same turn id again (a double submit) is not a new turn; a different one while a
        turn is in flight raises TurnInFlight; a conversation whose version is not a number raises
        UnreadableState, and nothing is written.
        """
        keys = Keys.of(conversation_id)
        doc = {**doc, "updated_at": time.time()}
        with _readable(conversation_id):
            outcome, value = self._begin(
                keys=[keys.meta, keys.history, keys.turns, keys.steps, keys.events],
                args=[turn_id, _dumps(user_message), _dumps(doc), ttl_s or self.ttl_s],
            )
        outcome = outcome.decode() if isinstance(outcome, bytes) else outcome
        value = value.decode() if isinstance(value, bytes) else value
        if outcome == "busy":
            raise TurnInFlight(conversation_id, value)
        if outcome == "unreadable":
            raise UnreadableState(conversation_id, "its version is not a whole number")
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
    ) -> int:
        """One atomic write: append what is new, replace the small fields, bump the version."""
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
            *(_dumps(m) for m in new_messages),
            *(_dumps(s) for s in new_steps),
        ]
        try:
            return int(self._publish(keys=[keys.meta, keys.history, keys.steps, keys.turns, keys.events], args=args))
        except redis.ResponseError as exc:
            reason, _, message = str(exc).partition(" ")
            if reason in ("GONE", "STALE", "CLOSED", "CONFLICT"):
                raise StoreError(reason, message) from exc
            raise

    def history_since(self, conversation_id: str, start: int) -> list[Message]:
        """The messages from index `start` on."""
        with _readable(conversation_id):
            return [well_formed.message(m) for m in self.redis.lrange(Keys.of(conversation_id).history, start, -1)]

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


class _readable:
    """Keys that hold the wrong kind of value (a string where a hash belongs) make the state unreadable."""

    def __init__(self, conversation_id: str):
        self.conversation_id = conversation_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc):
            raise UnreadableState(self.conversation_id, "its keys hold the wrong kind of value") from None
        return False


def _state(conversation_id: str, meta: dict, history: list, steps: list, turns: list) -> State:
    return well_formed.state(conversation_id, meta, history, steps, turns)
