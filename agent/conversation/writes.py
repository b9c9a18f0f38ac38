"""Writing a conversation: a turn begun, published, its live text; a turn parked, answered, resumed; the branch
shown; a conversation renamed or deleted. Mixed into Store (store.py), which adds what happens before a script.

Every write is one Lua script (scripts/*.lua) that refuses it when the turn is not the current one,
when the turn has already ended (done never reverts), when the turn's messages moved underneath, or when
another job writes the turn now. The same scripts keep the index and the meta hash's summary for the
list: `title` (the shown path's first message, cut; renamable), `turns` (the turns shown) and `bytes`
(what the tree holds, for the size cap).
"""

from __future__ import annotations

import json
import time
from typing import TypedDict

import redis

from agent.contract import Message, Step, TurnDoc, TurnSummary
from agent.conversation.errors import (
    ConversationFull,
    ConversationGone,
    NoSuchTurn,
    StoreError,
    TooManyTurns,
    TurnInFlight,
    UnreadableState,
)
from agent.conversation.keys import (
    APPROVALS_KEY,
    CONTINUING_KEY,
    INDEX_KEY,
    RESERVED_KEY,
    RUNNING_KEY,
    Keys,
    deleted_marker,
    gone_events,
    person_conversations,
    person_turns,
    turn_alive,
    turn_claim,
)
from agent.conversation.lua import Scripts
from agent.conversation.reads import readable
from agent.conversation.room import RESERVATION_TTL_S, RESERVE_BYTES
from agent.text.surrogates import scrub

DELETED_MARKER_TTL_S = 7 * 24 * 3600  # seconds an open tab can still learn that its conversation was deleted
GONE_EVENT_TTL_S = 60  # seconds the delete's wake-up entry lives: readers blocked at that moment take it at once
TITLE_CHARS = 80  # characters of the first message kept as a conversation's title


class NoRoom(Exception):
    """The turn's memory reservation did not fit beside those of the turns in flight: nothing was written."""


class LiveHead(TypedDict):
    """What meta keeps of a live text (the contract's `live` without its text), and its per-turn seq."""

    turn_id: str
    message_index: int
    attempt: int
    status: str
    seq: int  # 1, 2, ... per turn: one per model call attempt that wrote text


def make_title(text) -> str:
    """A conversation's title from untrusted text: control characters dropped, whitespace collapsed, cut."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(text or ""))
    text = " ".join(text.split())
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1].rstrip() + "…"


class Writes:
    """The store's writers, each one script (scripts/*.lua). Mixed into Store (store.py), they run on its client
    (`redis`) and scripts, with its TTL, its size cap and its door: `person` (a signed-in person's id: the scripts
    check it against the conversation's `owned_by`; "": the local playground and the operator) and `max_turns`.

    Two ids must not be confused: the person who owns a conversation (`owned_by`, the state's `owner`), and the
    job that owns a turn's writes (`writer`, meta's `writer`, the state's `job_id`): a write that names a writer
    is refused once another job took the turn over (a resume, an answer's continuation)."""

    redis: redis.Redis
    scripts: Scripts
    ttl_s: int
    max_conversation_bytes: int
    person: str
    max_turns: int

    def _begin(self, conversation_id: str, turn_id: str, user_message: Message, doc: TurnDoc, *, ttl_s: int,
               must_exist: bool, reserve_room: int = -1, branch_of: str = "") -> tuple[bool, int]:
        """Add the turn to the tree, shown and queued (see Store.begin_turn). Returns (new, version).

        `reserve_room`: the bytes left for the memory reservations of the turns in flight (room.py; -1: no
        limit): NoRoom when this one does not fit. A person's door begins only in a conversation of theirs, or
        a new one they then own, and at most `max_turns` (0: any number) of their turns in flight."""
        keys = Keys.of(conversation_id)
        now = time.time()
        doc = {**doc, "updated_at": now}
        person, max_bytes = self.person, self.max_conversation_bytes
        person_keys = [person_conversations(person), person_turns(person)] if person else []
        with readable(conversation_id):
            outcome, value = self.scripts.begin(
                keys=[keys.meta, keys.tree, keys.events, INDEX_KEY, keys.live, RESERVED_KEY, *person_keys],
                args=[turn_id, _dumps(user_message), _dumps(doc), ttl_s, conversation_id, repr(now),
                      make_title(user_message.get("content")), "1" if must_exist else "0", max_bytes,
                      doc.get("job_id") or "", person, self.max_turns, RESERVE_BYTES, reserve_room,
                      repr(now + min(ttl_s, RESERVATION_TTL_S)), keys.base, branch_of,
                      *(ended_turns(self.redis, person) if person else ())],
            )
        outcome, value = _text(outcome), _text(value)
        if outcome == "theirs":
            raise ConversationGone(conversation_id, False, found=False)
        if outcome == "many":
            raise TooManyTurns(int(value))
        if outcome == "busy":
            raise TurnInFlight(conversation_id, value)
        if outcome == "unreadable":
            raise UnreadableState(conversation_id, "its version is not a whole number")
        if outcome == "gone":
            raise ConversationGone(conversation_id, self.was_deleted(conversation_id))
        if outcome == "full":
            raise ConversationFull(conversation_id, int(value), max_bytes)
        if outcome == "room":
            raise NoRoom(value)
        if outcome == "no turn":
            raise NoSuchTurn(conversation_id, value)
        return outcome == "ok", int(value)

    def publish(
        self, conversation_id: str, turn_id: str, doc: TurnDoc, *, done: bool = False,
        new_messages: list[Message] = (), new_steps: list[Step] = (), expected_turn_len: int = -1,
        summary: TurnSummary | None = None, end_live: int = 0, writer: str = "",
    ) -> int:
        """One atomic write of a turn: append what is new to its record, replace the small fields, bump the version.

        `expected_turn_len`: the turn's messages the writer knows are stored (its person's included; -1: any):
        CONFLICT when the turn has another number. `end_live` (a live text's seq, 0 for none) clears that live
        text in the same write, and refuses any later live write for it; an ending (done) clears whatever live
        text there is. A write the contract forbids raises StoreError (GONE, STALE, CLOSED or CONFLICT).
        `writer`: the id of the job writing it, refused (STALE) once the turn was handed to another job; "" (a
        front end) writes for any job. Returns the new version."""
        keys = Keys.of(conversation_id)
        doc = {**doc, "updated_at": time.time()}
        args = [
            turn_id, expected_turn_len, _dumps(doc), "1" if done else "0", self.ttl_s, len(new_messages),
            len(new_steps), _dumps(summary) if summary else "", conversation_id, repr(doc["updated_at"]), end_live,
            writer, self.person, keys.base, *(_dumps(m) for m in new_messages),
            *(_dumps(s) for s in new_steps),
        ]
        try:
            return int(self.scripts.publish(
                keys=[keys.meta, keys.tree, keys.events, INDEX_KEY, keys.live, RUNNING_KEY, APPROVALS_KEY,
                      RESERVED_KEY],
                args=args))
        except redis.ResponseError as exc:
            raise _refusal(exc) from exc

    def write_live(self, conversation_id: str, turn_id: str, head: LiveHead, text: str, *,
                   from_bytes: int | None = None, writer: str = "") -> str:
        """Write the live text: the whole of it, or (`from_bytes`) the part that follows the stored text's first
        `from_bytes` bytes. Returns "ok", "ended" (its text was already cleared: nothing written) or "lag" (the
        stored text does not end at `from_bytes`: nothing written); refused as a publish is."""
        keys = Keys.of(conversation_id)
        args = [turn_id, self.ttl_s, _dumps(head), head["seq"], "whole" if from_bytes is None else "append",
                from_bytes or 0, scrub(text), writer, keys.base]
        try:
            outcome, _ = self.scripts.live(keys=[keys.meta, keys.live, keys.events, keys.tree], args=args)
        except redis.ResponseError as exc:
            raise _refusal(exc) from exc
        return _text(outcome)

    def resume(self, conversation_id: str, turn_id: str, lost_writer: str, new_writer: str, *, max_resumes: int,
               alive_ms: int, by_itself: bool = False) -> tuple[str, int]:
        """Hand a turn whose worker was lost to a new job, exactly once (scripts/resume.lua): ("ok", the new
        attempt), ("taken", _) when another job writes it or the lost one beats again, ("ended", _) when it is not
        in flight, ("spent", resumes made). `by_itself`: the lost job's heartbeat mark is no sign of life (its app
        is stopping, or its process was seen to end)."""
        keys = Keys.of(conversation_id)
        outcome, attempt = self.scripts.resume(
            keys=[keys.meta, turn_alive(turn_id), turn_claim(turn_id)],
            args=[turn_id, lost_writer, new_writer, max_resumes, alive_ms, "1" if by_itself else "0", keys.base])
        return _text(outcome), int(attempt)

    def park(self, conversation_id: str, turn_id: str, writer: str, doc: TurnDoc, *, request_id: str,
             expires_at: float, ttl_s: int, hold: bool = False) -> int:
        """Park the turn on a request for approval (scripts/park.lua): its job `writer` lets go of it (`hold`:
        keeps it, to wait itself). Returns the new version; StoreError when refused (ended, or another job writes
        it)."""
        keys = Keys.of(conversation_id)
        doc = {**doc, "updated_at": time.time()}
        try:
            return int(self.scripts.park(
                keys=[keys.meta, keys.events, RUNNING_KEY, APPROVALS_KEY, INDEX_KEY, keys.tree, keys.live],
                args=[turn_id, writer, _dumps(doc), request_id, repr(expires_at), conversation_id,
                      repr(doc["updated_at"]), max(ttl_s, self.ttl_s), "1" if hold else "0", keys.base]))
        except redis.ResponseError as exc:
            raise _refusal(exc) from exc

    def answer(self, conversation_id: str, turn_id: str, request_id: str, doc: TurnDoc, step: Step, *,
               new_writer: str, ttl_s: int, decision: str = "", look_at: float | None = None) -> tuple[str, int]:
        """Answer the pending request `request_id`, once (scripts/answer.lua); the job `new_writer` continues the
        turn: ("ok", version), or ("taken", 0) when that request is not the one waiting, ("late", 0) when Redis's
        clock says it expired before a person's `decision` came, ("ended", 0) or ("gone", 0). `look_at`: the
        answer enqueues a continuation, which the pool's watch looks for on the queue from then
        (agent:approvals:continuing)."""
        keys = Keys.of(conversation_id)
        doc = {**doc, "updated_at": time.time()}
        outcome, version = self.scripts.answer(
            keys=[keys.meta, keys.tree, keys.events, APPROVALS_KEY, INDEX_KEY, keys.live, CONTINUING_KEY,
                  turn_claim(turn_id)],
            args=[turn_id, request_id, _dumps(doc), _dumps(step), new_writer, conversation_id,
                  repr(doc["updated_at"]), max(ttl_s, self.ttl_s), self.person, decision,
                  "" if look_at is None else repr(look_at), keys.base])
        return _text(outcome), int(version)

    def turn_in_flight(self, conversation_id: str) -> str | None:
        """The id of the conversation's turn while it is in flight, else None."""
        turn_id, done = self.redis.hmget(Keys.of(conversation_id).meta, "turn_id", "done")
        return _text(turn_id) if turn_id is not None and done != b"1" else None

    def _delete_keys(self, conversation_id: str) -> bool:
        """Delete the conversation's keys and index entry, and leave the deleted marker; False if none existed
        (or, a person's door, none of theirs)."""
        keys, person = Keys.of(conversation_id), self.person
        existed = self.scripts.delete(
            keys=[*keys.all, INDEX_KEY, deleted_marker(conversation_id), gone_events(conversation_id), APPROVALS_KEY,
                  *([person_conversations(person)] if person else [])],
            args=[conversation_id, DELETED_MARKER_TTL_S, GONE_EVENT_TTL_S, person])
        return int(existed) > 0

    def was_deleted(self, conversation_id: str) -> bool:
        """True when the conversation was deleted (recently), rather than expired or never there; a person's
        door: only if they deleted it."""
        if not self.person:
            return bool(self.redis.exists(deleted_marker(conversation_id)))
        return _text(self.redis.get(deleted_marker(conversation_id))) == self.person

    def rename(self, conversation_id: str, title: str) -> bool:
        """Give a conversation a new title (cleaned and cut like any title); False when it does not exist."""
        person = self.person
        return bool(self.scripts.rename(
            keys=[Keys.of(conversation_id).meta, *([person_conversations(person)] if person else [])],
            args=[make_title(title), person, conversation_id, repr(time.time())]))

    def switch(self, conversation_id: str, turn_id: str) -> str:
        """Show the branch through `turn_id`, down to its latest turn (scripts/switch.lua): every reader of the
        conversation follows (its version moves), and the next message continues it. Returns the turn shown now.
        Refused while a turn is in flight or parked (TurnInFlight: Stop it first), NoSuchTurn, ConversationGone."""
        keys = Keys.of(conversation_id)
        with readable(conversation_id):
            outcome, value = self.scripts.switch(keys=[keys.meta, keys.tree, keys.events, INDEX_KEY],
                                                 args=[turn_id, repr(time.time()), self.person, conversation_id,
                                                       keys.base, self.ttl_s])
        outcome, value = _text(outcome), _text(value)
        if outcome == "busy":
            raise TurnInFlight(conversation_id, value)
        if outcome == "no turn":
            raise NoSuchTurn(conversation_id, turn_id)
        if outcome == "gone":
            raise ConversationGone(conversation_id, self.was_deleted(conversation_id), found=False)
        return value


def ended_turns(client: redis.Redis, person: str) -> list[bytes]:
    """The members of the person's turns in flight (`{conversation} {turn}`) whose turn has ended since: its
    conversation is gone, has moved on to another turn, or says done. A turn that ended never comes back,
    so the begin script may drop them even if more has happened meanwhile."""
    members = client.zrange(person_turns(person), 0, -1)
    if not members:
        return []
    with client.pipeline(transaction=False) as pipe:
        for member in members:
            pipe.hmget(Keys.of(_text(member).partition(" ")[0]).meta, "turn_id", "done")
        metas = pipe.execute(raise_on_error=False)
    ended = []
    for member, meta in zip(members, metas, strict=True):
        turn = _text(member).partition(" ")[2]
        if isinstance(meta, Exception) or meta[0] is None or _text(meta[0]) != turn or meta[1] == b"1":
            ended.append(member)
    return ended


def _refusal(exc: redis.ResponseError) -> Exception:
    reason, _, message = str(exc).partition(" ")
    if reason in ("GONE", "STALE", "CLOSED", "CONFLICT"):
        return StoreError(reason, message)
    return exc


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _dumps(value) -> str:
    # A lone surrogate that got this far (a tool's output, a quoted error) would make Redis's
    # UTF-8 encoding fail and lose the whole write: it is written as U+FFFD instead.
    return scrub(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
