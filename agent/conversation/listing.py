"""The list of conversations: most recent first, from the index the store keeps (agent/conversation/).

A page of the list is one ZREVRANGE on the index plus one HMGET per entry shown, in one pipeline:
it costs the same with 10 conversations as with 10,000, and no key is ever scanned. An entry whose
keys have expired (or were deleted by hand) is dropped when a listing meets it, and every listing
also sweeps a bounded batch of the entries older than the TTL, so the index shrinks with them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import redis

from agent.conversation.store import Store
from agent.conversation.well_formed import decoded

DEFAULT_PAGE = 50  # conversations one listing returns
SWEEP_BATCH = 100  # index entries older than the TTL checked per listing
# A text filter reads titles from the most recent back, page by page, and stops after this many:
# its cost is bounded too, and past that horizon it says it looked no further.
FILTER_HORIZON = 2000
_BATCH = 200  # index entries read per round-trip while filtering


@dataclass(frozen=True)
class ConversationInfo:
    """One row of the list."""

    conversation_id: str
    title: str
    updated_at: float  # epoch seconds of the last write
    turns: int
    in_flight: bool  # a turn is queued or running, or waits for a person's answer
    awaiting_approval: bool = False  # its turn is parked on a request for approval

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Listing:
    conversations: list[ConversationInfo]
    total: int  # conversations in the index (entries not yet swept included)
    searched_all: bool = True  # False when a filter stopped at FILTER_HORIZON


def list_conversations(store: Store, *, limit: int = DEFAULT_PAGE, text: str | None = None,
                       now: float | None = None) -> Listing:
    """The most recent `limit` conversations, those whose title contains `text` (any case) if given."""
    sweep_expired(store, now)
    needle = (text or "").strip().casefold()
    found: list[ConversationInfo] = []
    start = 0
    batch = limit if not needle else _BATCH
    while len(found) < limit:
        infos, read = _page(store, start, batch)
        start += read
        found += [info for info in infos if needle in info.title.casefold()] if needle else infos
        if read < batch or (needle and start >= FILTER_HORIZON):
            break
    total = store.index.count()
    return Listing(found[:limit], total, searched_all=not needle or start >= total or len(found) >= limit)


def _page(store: Store, start: int, count: int) -> tuple[list[ConversationInfo], int]:
    """The index entries from `start` (most recent first): the live ones, and how many entries were read."""
    entries = store.index.recent(start, count)
    if not entries:
        return [], 0
    metas = store.index.summaries([member for member, _ in entries])  # wrong-typed keys spoil no other row
    infos, gone = [], []
    for (member, score), meta in zip(entries, metas, strict=True):
        if isinstance(meta, Exception):
            infos.append(ConversationInfo(decoded(member), UNREADABLE_TITLE, float(score), 0, False))
            continue
        title, turns, done, approval = meta
        if done is None:  # its keys expired: the entry goes too
            gone.append(member)
            continue
        infos.append(_row(decoded(member), title, float(score), turns, done, approval))
    store.index.drop(gone)
    return infos, len(entries)


def sweep_expired(store: Store, now: float | None = None) -> int:
    """Drop up to SWEEP_BATCH index entries last written more than the TTL ago whose keys are gone.

    An entry older than the TTL may still be live (a turn waiting in the queue keeps a longer TTL),
    so each is checked before it is dropped. Returns how many were dropped."""
    now = time.time() if now is None else now
    old = store.index.written_before(now - store.ttl_s, SWEEP_BATCH)
    if not old:
        return 0
    gone = [member for member, alive in zip(old, store.index.alive(old), strict=True) if not alive]
    store.index.drop(gone)
    return len(gone)


def info(store: Store, conversation_id: str) -> ConversationInfo | None:
    """One conversation's row, or None when it does not exist (or is not one the store's person may read)."""
    if not store.sees_all and store.version(conversation_id) is None:
        return None
    try:
        title, turns, done, approval = store.index.summary(conversation_id)
    except redis.ResponseError:  # keys of the wrong kind: the page says it cannot be read
        return ConversationInfo(conversation_id, UNREADABLE_TITLE, 0.0, 0, False)
    if done is None:
        return None
    score = store.index.score(conversation_id)
    return _row(conversation_id, title, float(score or 0), turns, done, approval)


def _row(conversation_id: str, title, score: float, turns, done, approval=None) -> ConversationInfo:
    """A row from what the meta hash holds, whatever it holds (a hand-written hash may hold anything)."""
    try:
        count = max(0, int(turns or 0))
    except (TypeError, ValueError):
        count = 0
    in_flight = done != b"1"
    return ConversationInfo(conversation_id, decoded(title or b""), score, count, in_flight,
                            awaiting_approval=in_flight and bool(approval))


UNREADABLE_TITLE = "(cannot be read)"




def retention_words(ttl_s: int) -> str:
    """How long conversations are kept, in words: '30 days', '10 minutes', '45 seconds'."""
    for unit_s, unit in ((86_400, "day"), (3600, "hour"), (60, "minute")):
        if ttl_s >= 2 * unit_s:
            return f"{ttl_s / unit_s:.0f} {unit}s"
    return f"{ttl_s} seconds"
