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
    agent:conversations      sorted set: every conversation id, scored by its last write (epoch s):
                             the sidebar's and `list`'s index (agent/conversations.py), never a key scan
    agent:deleted:{id}       a marker that the conversation was deleted (not expired), for a while
    agent:gone:{id}          stream: one entry, added by the delete, that wakes every reader blocked on
                             the conversation's events at once (a deleted stream wakes no one); it
                             lives a minute

The live text is append-only while the same text (same seq) continues, so a reader that has its
first N bytes fetches only the rest (GETRANGE from N). The publish that appends the completed
message, or records the cut call's step, clears it in the same script; `live_ended` in meta is the
last seq cleared, so a late live write for a text already ended is refused.

The meta hash also holds the conversation's summary for the list: `title` (its first message,
cut; renamable), `turns` (turns begun) and `bytes` (what its lists hold, for the size cap).
The index is kept by the same scripts that write, so it never disagrees with a write; an entry
whose keys expired is dropped by the next listing (see agent/conversations.py).

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
from typing import TypedDict

import redis

from agent import bounded_json, well_formed
from agent.contract import LIST_FIELDS, Live, Message, State, Step, TurnDoc, TurnSummary
from agent.text.surrogates import scrub
from agent.well_formed import UnreadableState

KEY_PREFIX = "agent:"
INDEX_KEY = f"{KEY_PREFIX}conversations"
DELETED_MARKER_TTL_S = 7 * 24 * 3600  # seconds an open tab can still learn that its conversation was deleted
GONE_EVENT_TTL_S = 60  # seconds the delete's wake-up entry lives: readers blocked at that moment take it at once
TITLE_CHARS = 80  # characters of the first message kept as a conversation's title
# The most one conversation keeps (messages, steps and turn summaries, as stored JSON): past it, the
# next message is refused (ConversationFull). A turn in flight is never cut short by it, so a
# conversation can pass it by at most one turn's worth.
DEFAULT_MAX_CONVERSATION_BYTES = 8 * 1024 * 1024  # bytes
# Of Redis's maxmemory: past this, new turns are refused (StoreFull), so the last part is left for the
# turns already in flight to finish and write their endings (with noeviction, a full Redis refuses writes).
NEW_TURNS_UP_TO = 0.9
MEMORY_CHECK_EVERY_S = 1.0  # seconds an INFO memory reading is reused by the same store
MAX_BLOCK_MS = 1500  # a blocking read stays under the state client's 2 s socket timeout
# A conversation id names Redis keys and goes in URLs and command lines: letters, digits, '-' and '_'.
CONVERSATION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

_BEGIN = """
local meta, history, turns, steps, events, index, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local turn_id, message, doc, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local conversation_id, updated_at, title = ARGV[5], ARGV[6], ARGV[7]
local must_exist, max_bytes = ARGV[8] == '1', tonumber(ARGV[9])
local current = redis.call('HMGET', meta, 'turn_id', 'done', 'version', 'bytes')
-- A version that is not a whole number would fail HINCRBY below, after the message was appended.
if current[3] and not string.match(current[3], '^%d+$') then return {'unreadable', ''} end
if current[1] then
  if current[1] == turn_id then return {'same', current[3]} end
  if current[2] == '0' then return {'busy', current[1]} end
  if max_bytes > 0 and tonumber(current[4] or '0') >= max_bytes then return {'full', current[4]} end
elseif must_exist then
  return {'gone', ''}
end
redis.call('RPUSH', history, message)
local version = redis.call('HINCRBY', meta, 'version', 1)
redis.call('HSET', meta, 'turn_id', turn_id, 'done', '0', 'doc', doc)
redis.call('HDEL', meta, 'live', 'live_seq', 'live_ended')
redis.call('DEL', live)
redis.call('HSETNX', meta, 'title', title)
redis.call('HINCRBY', meta, 'turns', 1)
redis.call('HINCRBY', meta, 'bytes', #message)
redis.call('XADD', events, 'MAXLEN', '~', 16, version .. '-1', 'v', version)
for _, key in ipairs({meta, history, turns, steps, events}) do redis.call('EXPIRE', key, ttl) end
redis.call('ZADD', index, updated_at, conversation_id)
return {'ok', tostring(version)}
"""

_PUBLISH = """
local meta, history, steps, turns, events, index, live = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local turn_id, expected_len, doc, done, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
local n_messages, n_steps = tonumber(ARGV[6]), tonumber(ARGV[7])
local summary, conversation_id, updated_at, end_live = ARGV[8], ARGV[9], ARGV[10], tonumber(ARGV[11])
local current = redis.call('HMGET', meta, 'turn_id', 'done')
if not current[1] then return redis.error_reply('GONE the conversation has expired or was deleted') end
if current[1] ~= turn_id then return redis.error_reply('STALE another turn is current') end
if current[2] == '1' then return redis.error_reply('CLOSED the turn has already ended') end
if expected_len >= 0 and redis.call('LLEN', history) ~= expected_len then
  return redis.error_reply('CONFLICT the history moved')
end
local i, added = 12, #summary
for _ = 1, n_messages do redis.call('RPUSH', history, ARGV[i]); added = added + #ARGV[i]; i = i + 1 end
for _ = 1, n_steps do redis.call('RPUSH', steps, ARGV[i]); added = added + #ARGV[i]; i = i + 1 end
if summary ~= '' then redis.call('RPUSH', turns, summary) end
redis.call('HINCRBY', meta, 'bytes', added)
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
redis.call('ZADD', index, updated_at, conversation_id)
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

# Delete a conversation: its keys, its index entry, and a marker that says it was deleted.
_DELETE = """
local existed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('ZREM', KEYS[7], ARGV[1])
redis.call('SET', KEYS[8], '1', 'EX', tonumber(ARGV[2]))
redis.call('XADD', KEYS[9], 'MAXLEN', '~', 1, '*', 'gone', '1')
redis.call('EXPIRE', KEYS[9], tonumber(ARGV[3]))
return existed
"""

# Rename: only a conversation that exists (a rename never creates one); its TTL and place are kept.
_RENAME = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'title', ARGV[1])
return 1
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


class ConversationGone(Exception):
    """A message meant for an existing conversation found none: it expired or was deleted."""

    def __init__(self, conversation_id: str, deleted: bool):
        how = "was deleted" if deleted else "has expired"
        super().__init__(f"this conversation {how}, so your message was not sent")
        self.conversation_id = conversation_id
        self.deleted = deleted


class StoreFull(Exception):
    """Redis is close to its memory limit: new turns are refused so that the turns in flight can finish."""

    def __init__(self, used_bytes: int, max_bytes: int):
        super().__init__(
            f"the conversation store is full ({used_bytes / 1_048_576:.0f} of {max_bytes / 1_048_576:.0f} MiB, "
            "AGENT_REDIS_MAXMEMORY_MB): nothing was sent. Delete conversations you no longer need (download "
            "them first to keep them), or raise the limit")
        self.used_bytes = used_bytes
        self.max_bytes = max_bytes


class ConversationFull(Exception):
    """The conversation holds as much as one conversation may keep; a new message is refused."""

    def __init__(self, conversation_id: str, size_bytes: int, max_bytes: int):
        super().__init__(
            f"this conversation holds {size_bytes / 1_048_576:.1f} MiB, the most one conversation keeps "
            f"({max_bytes / 1_048_576:.1f} MiB, AGENT_MAX_CONVERSATION_BYTES): start a new chat, or download "
            "this one first to keep it")
        self.conversation_id = conversation_id
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


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

    @property
    def all(self) -> list[str]:
        return [self.meta, self.history, self.steps, self.turns, self.events, self.live]


def deleted_marker(conversation_id: str) -> str:
    return f"{KEY_PREFIX}deleted:{conversation_id}"


def gone_events(conversation_id: str) -> str:
    return f"{KEY_PREFIX}gone:{conversation_id}"


def make_title(text) -> str:
    """A conversation's title from untrusted text: control characters dropped, whitespace collapsed, cut."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(text or ""))
    text = " ".join(text.split())
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1].rstrip() + "…"


def _dumps(value) -> str:
    # A lone surrogate that got this far (a tool's output, a quoted error) would make Redis's
    # UTF-8 encoding fail and lose the whole write: it is written as U+FFFD instead.
    return scrub(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


class Store:
    def __init__(self, client: redis.Redis, ttl_s: int, *,
                 max_conversation_bytes: int = DEFAULT_MAX_CONVERSATION_BYTES):
        self.redis = client
        self.ttl_s = ttl_s
        self.max_conversation_bytes = max_conversation_bytes  # 0: no cap
        self._begin = client.register_script(_BEGIN)
        self._publish = client.register_script(_PUBLISH)
        self._live = client.register_script(_LIVE)
        self._delete = client.register_script(_DELETE)
        self._rename = client.register_script(_RENAME)
        self._memory: tuple[float, int, int] | None = None  # (monotonic time, used, maxmemory) last read

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
            # `$`: only a delete from now on wakes it (a delete before it shows as no version at all).
            self.redis.xread({keys.events: after, gone_events(conversation_id): "$"}, count=1, block=timeout_ms)
        return self.version(conversation_id)

    def read(self, conversation_id: str) -> State | None:
        """The whole state object of the contract, or None when unknown or expired."""
        keys = Keys.of(conversation_id)
        def queue(pipe):
            pipe.hgetall(keys.meta)
            pipe.lrange(keys.history, 0, -1)
            pipe.lrange(keys.steps, 0, -1)
            pipe.lrange(keys.turns, 0, -1)
            pipe.get(keys.live)

        with _readable(conversation_id):
            meta, history, steps, turns, live_text = self._snapshot(queue)
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

        def queue(pipe):
            pipe.hgetall(keys.meta)
            for key, start in zip(lists, have, strict=True):
                pipe.llen(key)
                pipe.lrange(key, start, -1)
            pipe.strlen(keys.live)
            pipe.getrange(keys.live, have_bytes, -1)

        with _readable(conversation_id):
            meta, n_history, history, n_steps, steps, n_turns, turns, n_live, live_tail = self._snapshot(queue)
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

    def _snapshot(self, queue) -> list:
        """The replies to the reads `queue(pipe)` adds, in one transaction: a consistent view.

        A Redis at its maxmemory refuses every command inside MULTI, reads too; then (and only then,
        when it refuses the writes that could interleave anyway) the reads go as a plain pipeline, so
        a full store can still be read, and a conversation opened to be downloaded or deleted."""
        try:
            with self.redis.pipeline(transaction=True) as pipe:
                queue(pipe)
                return pipe.execute()
        except (redis.exceptions.OutOfMemoryError, redis.exceptions.ExecAbortError):
            with self.redis.pipeline(transaction=False) as pipe:
                queue(pipe)
                return pipe.execute()

    def read_meta(self, conversation_id: str) -> State | None:
        """The small fields only (no history, steps or live text)."""
        with _readable(conversation_id):
            meta = self.redis.hgetall(Keys.of(conversation_id).meta)
        if not meta:
            return None
        state = _state(conversation_id, meta, [], [], [])
        state["live"] = None
        return state

    # -- writers ---------------------------------------------------------------------------

    def begin_turn(
        self, conversation_id: str, turn_id: str, user_message: Message, doc: TurnDoc, *, ttl_s: int | None = None,
        must_exist: bool = False,
    ) -> tuple[bool, int]:
        """Append the user's message and mark the turn queued. Returns (new, version).

        `ttl_s` (default: the store's) is the conversation's TTL while the turn waits for a worker.
        `must_exist`: the sender believes the conversation exists (an open tab, `--conversation`);
        if it has expired or was deleted meanwhile, ConversationGone is raised instead of quietly
        starting a new conversation under the same id.

        The same turn id again (a double submit) is not a new turn; a different one while a
        turn is in flight raises TurnInFlight; one past the size cap raises ConversationFull; a
        conversation whose version is not a number raises UnreadableState, and nothing is written.
        """
        self.check_room()
        keys = Keys.of(conversation_id)
        now = time.time()
        doc = {**doc, "updated_at": now}
        with _readable(conversation_id):
            outcome, value = self._begin(
                keys=[keys.meta, keys.history, keys.turns, keys.steps, keys.events, INDEX_KEY, keys.live],
                args=[turn_id, _dumps(user_message), _dumps(doc), ttl_s or self.ttl_s, conversation_id, repr(now),
                      make_title(user_message.get("content")), "1" if must_exist else "0",
                      self.max_conversation_bytes],
            )
        outcome = outcome.decode() if isinstance(outcome, bytes) else outcome
        value = value.decode() if isinstance(value, bytes) else value
        if outcome == "busy":
            raise TurnInFlight(conversation_id, value)
        if outcome == "unreadable":
            raise UnreadableState(conversation_id, "its version is not a whole number")
        if outcome == "gone":
            raise ConversationGone(conversation_id, self.was_deleted(conversation_id))
        if outcome == "full":
            raise ConversationFull(conversation_id, int(value), self.max_conversation_bytes)
        return outcome == "ok", int(value)

    def check_room(self) -> None:
        """Raise StoreFull when Redis has a memory limit and is past NEW_TURNS_UP_TO of it."""
        now = time.monotonic()
        if self._memory is None or now - self._memory[0] > MEMORY_CHECK_EVERY_S:
            try:
                info = self.redis.info("memory")
            except redis.ResponseError:  # a Redis whose ACL refuses INFO: its own refusals still say "full"
                info = {}
            self._memory = (now, int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)))
        _, used, limit = self._memory
        if limit and used >= limit * NEW_TURNS_UP_TO:
            self._memory = None  # look again next time: a deletion may have made room
            raise StoreFull(used, limit)

    def was_deleted(self, conversation_id: str) -> bool:
        """True when the conversation was deleted (recently), rather than expired or never there."""
        return bool(self.redis.exists(deleted_marker(conversation_id)))

    def delete(self, conversation_id: str) -> bool:
        """Delete a conversation; a turn in flight is asked to stop first, and its later writes are
        refused (GONE), so its job ends without a word. False when there was nothing to delete."""
        keys = Keys.of(conversation_id)
        turn_id, done = self.redis.hmget(keys.meta, "turn_id", "done")
        if turn_id is not None and done != b"1":
            self.request_cancel(_text(turn_id), DELETED_MARKER_TTL_S)
        existed = self._delete(keys=[*keys.all, INDEX_KEY, deleted_marker(conversation_id),
                                     gone_events(conversation_id)],
                               args=[conversation_id, DELETED_MARKER_TTL_S, GONE_EVENT_TTL_S])
        return int(existed) > 0

    def rename(self, conversation_id: str, title: str) -> bool:
        """Give a conversation a new title (cleaned and cut like any title); False when it does not exist."""
        return bool(self._rename(keys=[Keys.of(conversation_id).meta], args=[make_title(title)]))

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
            conversation_id,
            repr(doc["updated_at"]),
            end_live,
            *(_dumps(m) for m in new_messages),
            *(_dumps(s) for s in new_steps),
        ]
        try:
            return int(self._publish(keys=[keys.meta, keys.history, keys.steps, keys.turns, keys.events, INDEX_KEY,
                                           keys.live],
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


def _refusal(exc: redis.ResponseError) -> Exception:
    reason, _, message = str(exc).partition(" ")
    if reason in ("GONE", "STALE", "CLOSED", "CONFLICT"):
        return StoreError(reason, message)
    return exc


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _same_text(a: Live, b: Live) -> bool:
    return (a["turn_id"], a["message_index"], a["attempt"]) == (b["turn_id"], b["message_index"], b["attempt"])


def _live(head_json, text) -> Live | None:
    """The text being written, from its head in meta and its key; a head that cannot be read is no live text
    (it is transient: the next write replaces it, and the history never depends on it)."""
    if not head_json:
        return None
    try:
        head = bounded_json.loads(head_json)
        return Live(turn_id=str(head["turn_id"]), message_index=int(head["message_index"]),
                    attempt=int(head["attempt"]), text=well_formed.decoded(text or b""), status=str(head["status"]))
    except (ValueError, TypeError, KeyError):  # ValueError: not JSON, or nested too deeply (TooDeep)
        return None


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


def _state(conversation_id: str, meta: dict, history: list, steps: list, turns: list, live_text=None) -> State:
    state = well_formed.state(conversation_id, meta, history, steps, turns)
    state["live"] = _live(meta.get(b"live", meta.get("live")), live_text)
    return state
