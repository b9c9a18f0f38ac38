"""Reading a conversation back as the state contract: the cheap poll, the blocking wait, the whole state,
and only what is new since an earlier read.

Whatever the keys hold, a read returns a well-formed State or raises UnreadableState
(agent/conversation/well_formed.py holds the rule): never a JSON, type or recursion error.
"""

from __future__ import annotations

import redis

from agent import bounded_json
from agent.contract import LIST_FIELDS, Live, Message, State
from agent.conversation import well_formed
from agent.conversation.errors import UnreadableState
from agent.conversation.keys import Keys, gone_events

MAX_BLOCK_MS = 1500  # a blocking read stays under the state client's 2 s socket timeout


def version(client: redis.Redis, conversation_id: str, *, owned_by: str | None = None) -> int | None:
    """The cheap poll: one HGET. UnreadableState when what is stored is not a version.

    `owned_by` (a person's id): None as well when the conversation is not theirs, in the same one read."""
    with readable(conversation_id):
        if owned_by is None:
            raw = client.hget(Keys.of(conversation_id).meta, "version")
        else:
            raw, owner = client.hmget(Keys.of(conversation_id).meta, "version", "owned_by")
            if owner is None or owner.decode(errors="replace") != owned_by:
                return None
    return well_formed.version(conversation_id, raw) if raw is not None else None


def wait_version(client: redis.Redis, conversation_id: str, seen: int | None, timeout_ms: int) -> int | None:
    """Block until the version is past `seen` (or the timeout), then return the version.

    One blocking read on the conversation's event stream: a client wakes within
    milliseconds of a write instead of up to a whole poll interval later."""
    keys = Keys.of(conversation_id)
    timeout_ms = max(1, min(int(timeout_ms), MAX_BLOCK_MS))
    after = f"{seen}-1" if seen else "0-0"
    with readable(conversation_id):
        # `$`: only a delete from now on wakes it (a delete before it shows as no version at all).
        client.xread({keys.events: after, gone_events(conversation_id): "$"}, count=1, block=timeout_ms)
    return version(client, conversation_id)


def read(client: redis.Redis, conversation_id: str) -> State | None:
    """The whole state object of the contract, or None when unknown or expired."""
    keys = Keys.of(conversation_id)

    def queue(pipe):
        pipe.hgetall(keys.meta)
        pipe.lrange(keys.history, 0, -1)
        pipe.lrange(keys.steps, 0, -1)
        pipe.lrange(keys.turns, 0, -1)
        pipe.get(keys.live)

    with readable(conversation_id):
        meta, history, steps, turns, live_text = snapshot(client, queue)
    if not meta:
        return None
    return _state(conversation_id, meta, history, steps, turns, live_text)


def read_since(client: redis.Redis, conversation_id: str, known: State | None) -> State | None:
    """The whole state object, fetching only what was appended since `known` (an earlier read).

    History, steps and turn summaries are append-only, so a client that follows a turn reads
    the small fields and the new tail of each list: O(new), not O(conversation). So is the live
    text while the same text continues: only the bytes past the ones `known` holds are fetched."""
    if not known:
        return read(client, conversation_id)
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

    with readable(conversation_id):
        meta, n_history, history, n_steps, steps, n_turns, turns, n_live, live_tail = snapshot(client, queue)
    if not meta:
        return None
    if [n_history, n_steps, n_turns] != [a + len(b) for a, b in zip(have, (history, steps, turns), strict=True)]:
        return read(client, conversation_id)  # not the lists `known` was read from (expired, re-created)
    fresh = _state(conversation_id, meta, history, steps, turns, live_tail)
    live = fresh["live"]
    if live is not None and have_bytes:
        if not _same_text(live, known_live) or n_live < have_bytes:
            # Another text than the one `known` holds the start of: read this one whole.
            return read_since(client, conversation_id, {**known, "live": None})
        live["text"] = known_live["text"] + live["text"]
    for name in LIST_FIELDS:
        fresh[name] = known[name] + fresh[name]
    return fresh


def snapshot(client: redis.Redis, queue) -> list:
    """The replies to the reads `queue(pipe)` adds, in one transaction: a consistent view.

    A Redis at its maxmemory refuses every command inside MULTI, reads too; then (and only then,
    when it refuses the writes that could interleave anyway) the reads go as a plain pipeline, so
    a full store can still be read, and a conversation opened to be downloaded or deleted."""
    try:
        with client.pipeline(transaction=True) as pipe:
            queue(pipe)
            return pipe.execute()
    except (redis.exceptions.OutOfMemoryError, redis.exceptions.ExecAbortError):
        with client.pipeline(transaction=False) as pipe:
            queue(pipe)
            return pipe.execute()


def read_meta(client: redis.Redis, conversation_id: str) -> State | None:
    """The small fields only (no history, steps or live text)."""
    with readable(conversation_id):
        meta = client.hgetall(Keys.of(conversation_id).meta)
    if not meta:
        return None
    state = _state(conversation_id, meta, [], [], [])
    state["live"] = None
    return state


def history_since(client: redis.Redis, conversation_id: str, start: int) -> list[Message]:
    """The messages from index `start` on."""
    with readable(conversation_id):
        return [well_formed.message(m) for m in client.lrange(Keys.of(conversation_id).history, start, -1)]


def history_len(client: redis.Redis, conversation_id: str) -> int:
    return int(client.llen(Keys.of(conversation_id).history))


class readable:
    """Keys that hold the wrong kind of value (a string where a hash belongs) make the state unreadable."""

    def __init__(self, conversation_id: str):
        self.conversation_id = conversation_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc):
            raise UnreadableState(self.conversation_id, "its keys hold the wrong kind of value") from None
        return False


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


def _state(conversation_id: str, meta: dict, history: list, steps: list, turns: list, live_text=None) -> State:
    state = well_formed.state(conversation_id, meta, history, steps, turns)
    state["live"] = _live(meta.get(b"live", meta.get("live")), live_text)
    # The job that owns the turn now, and its attempt: a resume hands them over before the new job writes.
    owner, attempt = meta.get(b"owner", meta.get("owner")), meta.get(b"attempt", meta.get("attempt"))
    if owner:
        state["job_id"] = well_formed.decoded(owner)
    if attempt and well_formed.decoded(attempt).isdigit():
        state["attempt"] = int(well_formed.decoded(attempt))
    owned_by = meta.get(b"owned_by", meta.get("owned_by"))
    state["owner"] = well_formed.decoded(owned_by) if owned_by else None
    return state
