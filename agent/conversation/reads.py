"""Reading a conversation back as the state contract: the cheap poll, the blocking wait, the whole state,
and only what is new since an earlier read.

Whatever the keys hold, a read returns a well-formed State or raises UnreadableState
(agent/conversation/well_formed.py holds the rule): never a JSON, type or recursion error.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

import redis

from agent import bounded_json
from agent.contract import Live, Message, Role, State, Step
from agent.conversation import lua, well_formed
from agent.conversation.errors import UnreadableState
from agent.conversation.keys import Keys, gone_events

MAX_BLOCK_MS = 1500  # a blocking read stays under the state client's 2 s socket timeout
TURN_CACHE_SIZE = 20_000  # turns (their messages, steps and summary, parsed) kept by a process's readers
TURN_CACHE_BYTES = 64 * 1024 * 1024  # ... and roughly the most bytes of text they hold
PATH_CACHE_SIZE = 1000  # paths (each turn's id, parent, siblings, counts) kept by a process's readers
PATH_CACHE_ROWS = 500_000  # ... and the most turns in them all


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


def read(client: redis.Redis, conversation_id: str, *, tip: str = "") -> State | None:
    """The whole state object of the contract (the path shown, or the path to `tip`), or None when unknown or
    expired."""
    return read_since(client, conversation_id, None, tip=tip)


def read_since(client: redis.Redis, conversation_id: str, known: State | None, *, tip: str = "") -> State | None:
    """The whole state object, fetching only what is new since `known` (an earlier read).

    While the tree and the turn shown are the ones `known` was read from (its `tree_version`), only what the shown
    turn added since is fetched, and the live text past the bytes `known` holds: O(new), not O(conversation).
    Otherwise the path is read again, and of its turns only those not in the cache (TURN_CACHE: a turn by its id
    and version) are fetched: a reader fetches a turn once."""
    keys = Keys.of(conversation_id)
    args = [tip]
    held = None
    if known and known.get("conversation_id") == conversation_id and known.get("tree_version") and not tip:
        known_live = known.get("live")
        have_bytes = len(known_live["text"].encode()) if known_live else 0
        messages, steps = _tip_counts(known)
        held = PATH_CACHE.get((conversation_id, known["tree_version"], known["turn_id"]))
        args += [str(known["tree_version"]), known["turn_id"], messages, steps, have_bytes, "1" if held else "0"]
    else:
        known, have_bytes = None, 0
    with readable(conversation_id):
        reply = client.register_script(lua.source("read"))(
            keys=[keys.meta, keys.tree, keys.live, keys.history, keys.steps, keys.turns], args=args)
    kind = well_formed.decoded(reply[0])
    if kind == "none":
        return None
    meta = _pairs(reply[1])
    if kind == "flat":
        return _flat_state(conversation_id, meta, reply[3], reply[4], reply[5], reply[2])
    if kind == "since":
        return _since_state(client, conversation_id, meta, reply, known, have_bytes)
    if kind == "fork":
        rows = _forked(held, int(reply[3]), _rows(reply[4]), reply[5])
    else:
        rows = _rows(reply[3])
    return _path_state(client, conversation_id, meta, reply[2], rows)


def _pairs(flat: list) -> dict:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def _tip_counts(known: State) -> tuple[int, int]:
    """How many of its shown turn's messages and steps `known` holds: its messages start at its person's message
    (the last user message of the history), its steps are the last ones, all of that turn."""
    history, steps = known.get("history") or [], known.get("steps") or []
    start = len(history) - 1
    while start > 0 and history[start].get("role") != Role.USER:
        start -= 1
    first = len(steps)
    while first > 0 and steps[first - 1].get("turn_id") == known["turn_id"]:
        first -= 1
    return len(history) - max(start, 0), len(steps) - first


@dataclass(frozen=True)
class TurnRecord:
    """One turn of the tree as the store holds it, read once per version (TURN_CACHE)."""

    turn_id: str
    messages: list[Message]
    steps: list[Step]
    summary: dict | None
    doc: bytes | None  # its small fields as its ending wrote them (None: not ended, or a flat turn)


class _Cache:
    """What a process's readers read, least recently used first out, bounded by items and by a weight (`weigh`):
    the turns by (conversation, turn, version), weighed in rough bytes (a turn's record changes only with its
    version, so it is fetched once), and the paths by (conversation, tree version, tip), weighed in turns."""

    def __init__(self, size: int, max_weight: int, weigh):
        self.size, self.max_weight, self.weigh = size, max_weight, weigh
        self.items: OrderedDict = OrderedDict()  # key -> (value, weight)
        self.weight = 0
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            found = self.items.get(key)
            if found is None:
                return None
            self.items.move_to_end(key)
            return found[0]

    def put(self, key, value) -> None:
        weight = self.weigh(value)
        if weight > self.max_weight:
            return
        with self.lock:
            old = self.items.pop(key, None)
            self.weight += weight - (old[1] if old else 0)
            self.items[key] = (value, weight)
            while len(self.items) > self.size or self.weight > self.max_weight:
                self.weight -= self.items.popitem(last=False)[1][1]


def _size(record: TurnRecord) -> int:
    """Roughly the bytes a record holds: its texts, and a little for each item."""
    return sum(len(m.get("content") or "") + 200 for m in record.messages) + sum(
        len(s.get("result") or "") + len(s.get("arguments") or "") + len(s.get("partial_text") or "") + 400
        for s in record.steps) + 1000


TURN_CACHE = _Cache(TURN_CACHE_SIZE, TURN_CACHE_BYTES, _size)


def _fetch_turns(client: redis.Redis, conversation_id: str, wanted: list[tuple[str, int, int, int]]) -> None:
    """Read the records of the turns `wanted` (id, version, messages, steps) into the cache, in one round-trip."""
    if not wanted:
        return
    tree = Keys.of(conversation_id).tree
    with client.pipeline(transaction=False) as pipe:
        for turn_id, _v, n, s in wanted:
            fields = [f"{turn_id}:sum", f"{turn_id}:doc", *(f"{turn_id}:m:{i}" for i in range(n)),
                      *(f"{turn_id}:s:{i}" for i in range(s))]
            pipe.hmget(tree, fields)
        with readable(conversation_id):
            replies = pipe.execute()
    for (turn_id, v, n, _s), values in zip(wanted, replies, strict=True):
        TURN_CACHE.put((conversation_id, turn_id, v), _record(turn_id, values[0], values[1], values[2:2 + n],
                                                                 values[2 + n:]))


def turn_records(client: redis.Redis, conversation_id: str, turn_ids: list[str]) -> list[TurnRecord]:
    """The records of these turns of the tree, each read once per version (TURN_CACHE)."""
    tree = Keys.of(conversation_id).tree
    with client.pipeline(transaction=False) as pipe:
        for turn_id in turn_ids:
            pipe.hmget(tree, [f"{turn_id}:v", f"{turn_id}:n", f"{turn_id}:s"])
        with readable(conversation_id):
            counts = [(int(v or 0), int(n or 0), int(s or 0)) for v, n, s in pipe.execute()]
    _fetch_turns(client, conversation_id, [(t, v, n, s) for t, (v, n, s) in zip(turn_ids, counts, strict=True)
                                           if TURN_CACHE.get((conversation_id, t, v)) is None])
    return [TURN_CACHE.get((conversation_id, t, v)) or TurnRecord(t, [], [], None, None)
            for t, (v, _n, _s) in zip(turn_ids, counts, strict=True)]


def _record(turn_id: str, summary, doc, messages: list, steps: list) -> TurnRecord:
    parsed_steps = [well_formed.step(raw or b"", turn_id) for raw in steps]
    return TurnRecord(turn_id, [well_formed.message(raw or b"") for raw in messages], parsed_steps,
                      well_formed.summary(summary) if summary else None, doc or None)


# The paths read: per turn from the first to the tip, its id, parent, siblings, version and counts. A reader that
# holds one is sent only where the tree's path now leaves it (read.lua's 'fork'): a switch at turn 1,000 reads the
# turns below the fork, not the 1,000 above it.
PATH_CACHE = _Cache(PATH_CACHE_SIZE, PATH_CACHE_ROWS, len)


def _rows(path: list) -> list[tuple]:
    return [(well_formed.decoded(r[0]), well_formed.decoded(r[1]), well_formed.decoded(r[2]).split(),
             int(r[3] or 0), int(r[4] or 0), int(r[5] or 0)) for r in path]


def _forked(held: tuple, kept: int, below: list[tuple], changes: list) -> list[tuple]:
    """The path now: the first `kept` turns of the one held, their siblings as `changes` left them (a turn added
    beside one of them since), then the turns `below` the fork."""
    kids = {well_formed.decoded(parent): well_formed.decoded(now).split() for parent, now in changes}
    return [(t, parent, kids.get(parent, siblings), v, n, s) for t, parent, siblings, v, n, s in held[:kept]] + below


def _path_state(client: redis.Redis, conversation_id: str, meta: dict, live_text, rows: list[tuple]) -> State:
    missing = [(turn_id, v, n, s) for turn_id, _p, _k, v, n, s in rows
               if TURN_CACHE.get((conversation_id, turn_id, v)) is None]
    _fetch_turns(client, conversation_id, missing)
    records = []
    for turn_id, parent, siblings, v, n, s in rows:
        record = TURN_CACHE.get((conversation_id, turn_id, v))
        if record is None:  # pushed out meanwhile by other readers: read it again, alone
            _fetch_turns(client, conversation_id, [(turn_id, v, n, s)])
            record = TURN_CACHE.get((conversation_id, turn_id, v)) or TurnRecord(turn_id, [], [], None, None)
        records.append((record, parent, list(siblings)))  # the state's own: the path held (PATH_CACHE) stays as read
    state = _tree_state(conversation_id, meta, records, live_text)
    if rows and not rows[0][1]:  # a whole path, from a first turn (a reader that holds it is sent only the fork)
        PATH_CACHE.put((conversation_id, state["tree_version"], rows[-1][0]), tuple(rows))
    return state


def _since_state(client, conversation_id: str, meta: dict, reply: list, known: State, have_bytes: int) -> State:
    _kind, _meta, n_live, live_tail, v, _n, _s, summary, doc, messages, steps = reply
    tip = known["turn_id"]
    record = _record(tip, summary, doc, messages, steps)
    had_messages, had_steps = _tip_counts(known)
    whole = TurnRecord(tip, known["history"][len(known["history"]) - had_messages:] + record.messages,
                       known["steps"][len(known["steps"]) - had_steps:] + record.steps, record.summary, record.doc)
    TURN_CACHE.put((conversation_id, tip, int(v or 0)), whole)  # as the script read it: whole at this version
    fresh = _tree_state(conversation_id, meta, [(record, known.get("parent_turn_id") or "",
                                                 list(known.get("siblings") or [tip]))], live_tail)
    fresh["history"] = known["history"] + fresh["history"]
    fresh["steps"] = known["steps"] + fresh["steps"]
    ended = [t for t in known["turns"] if t.get("turn_id") != tip]
    fresh["turns"] = ended + fresh["turns"] if fresh["turns"] else list(known["turns"])
    live, known_live = fresh["live"], known.get("live")
    if live is not None and have_bytes:
        if not _same_text(live, known_live) or int(n_live) < have_bytes:
            # Another text than the one `known` holds the start of: read this one whole.
            return read_since(client, conversation_id, {**known, "live": None})
        live["text"] = known_live["text"] + live["text"]
    return fresh


def _tree_state(conversation_id: str, meta: dict, records: list, live_text) -> State:
    """The state of the path `records` (each a TurnRecord, its parent, its siblings): the meta's turn when it is the
    one shown, else (another branch shown, no turn in flight) the shown turn as its ending left it."""
    meta = {well_formed.decoded(k): v for k, v in meta.items()}
    latest = well_formed.decoded(meta.get("turn_id") or b"")
    in_flight = well_formed.decoded(meta.get("done") or b"") == "0"
    shown = records[-1][0].turn_id if records else latest
    if shown != latest and records and latest and not in_flight and well_formed.decoded(meta.get("done")) == "1":
        # (A meta that names no turn, or says neither done nor in flight, is left as it is: unreadable.)
        record = records[-1][0]
        meta = {**meta, "turn_id": shown, "done": b"1",
                "doc": record.doc or (json.dumps(record.summary) if record.summary else b"{}")}
        meta.pop("live", None)
        live_text = None
    state = _state(conversation_id, meta, [], [], [], live_text)
    history, steps, turns = [], [], []
    for record, parent, siblings in records:
        history += record.messages
        steps += record.steps
        if record.summary is not None and not (in_flight and record.turn_id == latest):
            turns.append({**record.summary, "turn_id": record.summary.get("turn_id") or record.turn_id,
                          "parent_turn_id": parent or None, "siblings": siblings})
    state["history"], state["steps"], state["turns"] = history, steps, turns
    parent, siblings = (records[-1][1], records[-1][2]) if records else ("", [shown])
    state["parent_turn_id"], state["siblings"] = parent or None, siblings
    state["tree_version"] = int(well_formed.decoded(meta.get("tree_v") or b"0") or 0)
    return state


def _flat_state(conversation_id: str, meta: dict, history: list, steps: list, turns: list, live_text) -> State:
    """A conversation as a release before the tree stored it (scripts/included/tree.lua): each turn's parent is the one
    before it, and it has no siblings."""
    state = _state(conversation_id, meta, history, steps, turns, live_text)
    ids = [summary["turn_id"] for summary in state["turns"]]
    for index, summary in enumerate(state["turns"]):
        summary["parent_turn_id"], summary["siblings"] = (ids[index - 1] if index else None), [summary["turn_id"]]
    earlier = ids[:-1] if ids and ids[-1] == state["turn_id"] else ids
    state["parent_turn_id"] = earlier[-1] if earlier else None
    state["siblings"] = [state["turn_id"]]
    state["tree_version"] = 0
    return state


def read_meta(client: redis.Redis, conversation_id: str) -> State | None:
    """The small fields only (no history, steps or live text)."""
    with readable(conversation_id):
        meta = client.hgetall(Keys.of(conversation_id).meta)
    if not meta:
        return None
    state = _state(conversation_id, meta, [], [], [])
    state["live"] = None
    return state


def turn_messages_since(client: redis.Redis, conversation_id: str, turn_id: str, start: int) -> list[Message]:
    """The turn's messages from its `start`-th on (0: its person's message)."""
    tree = Keys.of(conversation_id).tree
    with readable(conversation_id):
        n = int(client.hget(tree, f"{turn_id}:n") or 0)
        if n <= start:
            return []
        raw = client.hmget(tree, [f"{turn_id}:m:{i}" for i in range(start, n)])
    return [well_formed.message(m or b"") for m in raw]


def turn_message(client: redis.Redis, conversation_id: str, turn_id: str) -> Message | None:
    """The turn's person's message, or None when the conversation has no such turn."""
    with readable(conversation_id):
        raw = client.hget(Keys.of(conversation_id).tree, f"{turn_id}:m:0")
    return well_formed.message(raw) if raw is not None else None


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


def _field(meta: dict, name: str):
    return meta.get(name.encode(), meta.get(name))


def _state(conversation_id: str, meta: dict, history: list, steps: list, turns: list, live_text=None) -> State:
    state = well_formed.state(conversation_id, meta, history, steps, turns)
    state["live"] = _live(meta.get(b"live", meta.get("live")), live_text)
    # The job that writes the turn now, and its attempt: a resume hands them over before the new job writes. (A
    # conversation of the flat shape names it `owner`, as the release before the tree did: included/tree.lua.)
    writer = _field(meta, "writer") or _field(meta, "owner")
    attempt = _field(meta, "attempt")
    if writer:
        state["job_id"] = well_formed.decoded(writer)
    if attempt and well_formed.decoded(attempt).isdigit():
        state["attempt"] = int(well_formed.decoded(attempt))
    owned_by = _field(meta, "owned_by")
    state["owner"] = well_formed.decoded(owned_by) if owned_by else None
    return state
