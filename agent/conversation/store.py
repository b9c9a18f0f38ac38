"""The conversation state in Redis: versions, TTL, one turn at a time. The object it reads back
is the state contract (agent/contract.py); the keys it keeps are listed in keys.py.

`Store` is the one door: every reader and writer of a conversation, of the index and of the turn
flags goes through it, and it composes the parts that do the work:

    reads.py    the cheap poll, the blocking wait, the whole state, only what is new since a read
    writes.py   a turn begun, published, its live text; rename and delete (each a script in scripts/)
    room.py     new turns refused near Redis's memory limit (StoreFull)
    index.py    the conversations' index and the list's summaries (store.index)
    flags.py    who runs a turn, Stop asked, a queued job seen missing from its queue (store.flags)
    errors.py   what it refuses, under one root: StoreRefused

A store bound to a signed-in person (`for_person`) is that person's door: it reads only their
conversations (an admin's reads all), answers for anyone else's as for one that does not exist, writes
only theirs (each write script checks `owned_by` in the same step as the write), lists from their own
index, and refuses a new turn past their share of turns in flight. An unbound store (the local playground,
the CLI, the workers) reads and writes every conversation, as the machine's operator does.

The live text is append-only while the same text (same seq) continues, so a reader that has its
first N bytes fetches only the rest (GETRANGE from N). The publish that appends the completed
message, or records the cut call's step, clears it in the same script; `live_ended` in meta is the
last seq cleared, so a late live write for a text already ended is refused.

A poll that finds no change is one HGET of `version`; a publish appends only what is new.
"""

from __future__ import annotations

import copy

import redis

from agent.contract import Message, State, Step, TurnDoc, TurnSummary
from agent.conversation import people, reads
from agent.conversation.flags import Flags
from agent.conversation.index import ConversationIndex
from agent.conversation.keys import INDEX_KEY, Keys, person_conversations, person_turns
from agent.conversation.room import Room
from agent.conversation.writes import DELETED_MARKER_TTL_S, LiveHead, Writes

# The most one conversation keeps (messages, steps and turn summaries, as stored JSON): past it, the
# next message is refused (ConversationFull). A turn in flight is never cut short by it, so a
# conversation can pass it by at most one turn's worth.
DEFAULT_MAX_CONVERSATION_BYTES = 8 * 1024 * 1024  # bytes


class Store:
    """Conversations in Redis, read and written as the state contract; refusals raise StoreRefused."""

    def __init__(self, client: redis.Redis, ttl_s: int, *,
                 max_conversation_bytes: int = DEFAULT_MAX_CONVERSATION_BYTES):
        self.redis = client
        self.ttl_s = ttl_s  # a turn's job may lengthen it for the writes it makes
        self.max_conversation_bytes = max_conversation_bytes  # 0: no cap
        self.index = ConversationIndex(client, INDEX_KEY)
        self.flags = Flags(client)
        self.room = Room(client)
        self._writes = Writes(client)  # its scripts registered once, on this client
        self.person = ""  # the signed-in person this store is the door of; "": everyone's (see for_person)
        self.sees_all = True  # reads every conversation (unbound, or an admin)
        self.max_turns = 0  # the person's turns in flight at most (0: any number)

    def for_person(self, person_id: str, *, admin: bool = False, max_turns: int = 0) -> Store:
        """This store as the door of one signed-in person: their conversations only (an `admin` reads, and
        lists, everyone's, and still writes only their own), at most `max_turns` of their turns in flight."""
        bound = copy.copy(self)  # the client and its registered scripts are shared
        bound.person, bound.sees_all, bound.max_turns = person_id, admin, max_turns
        if not admin:
            bound.index = ConversationIndex(self.redis, person_conversations(person_id))
        return bound

    def visible(self, state: State | None) -> State | None:
        """The state when this store's person may read it, else None (as if it did not exist)."""
        if state is None or self.sees_all or state.get("owner") == self.person:
            return state
        return None

    def turns_in_flight(self) -> list[str]:
        """The conversations whose turns count against this store's person's share (none when unbound): some may
        have ended since (they are dropped at the next begin), or have lost their job without an ending."""
        if not self.person:
            return []
        members = self.redis.zrange(person_turns(self.person), 0, -1)
        return [_text(member).partition(" ")[0] for member in members]

    def owner_email(self, person_id: str) -> str | None:
        """The email a conversation's owner signed in with (see people.py), or None."""
        return people.email_of(self.redis, person_id)

    def owns(self, state: State | None) -> bool:
        """Whether this store's person may write to the conversation (the operator may write any)."""
        return state is not None and (not self.person or state.get("owner") == self.person)

    # -- readers (reads.py) ------------------------------------------------------------------

    def version(self, conversation_id: str) -> int | None:
        """The cheap poll: one small read. UnreadableState when what is stored is not a version."""
        if self.sees_all:
            return reads.version(self.redis, conversation_id)
        return reads.version(self.redis, conversation_id, owned_by=self.person)

    def wait_version(self, conversation_id: str, seen: int | None, timeout_ms: int) -> int | None:
        """Block until the version is past `seen` (or the timeout, at most MAX_BLOCK_MS), then return it."""
        version = reads.wait_version(self.redis, conversation_id, seen, timeout_ms)
        return version if self.sees_all else self.version(conversation_id)

    def read(self, conversation_id: str) -> State | None:
        """The whole state object of the contract, or None when unknown or expired."""
        return self.visible(reads.read(self.redis, conversation_id))

    def read_since(self, conversation_id: str, known: State | None) -> State | None:
        """The whole state object, fetching only what was appended since `known` (an earlier read)."""
        return self.visible(reads.read_since(self.redis, conversation_id, known))

    def read_meta(self, conversation_id: str) -> State | None:
        """The small fields only (no history, steps or live text)."""
        return self.visible(reads.read_meta(self.redis, conversation_id))

    def live_seq(self, conversation_id: str) -> int:
        """The seq of the conversation's latest live text (0: none yet in this turn)."""
        seq = self.redis.hget(Keys.of(conversation_id).meta, "live_seq")
        return int(seq) if seq and seq.isdigit() else 0

    def history_since(self, conversation_id: str, start: int) -> list[Message]:
        """The messages from index `start` on."""
        return reads.history_since(self.redis, conversation_id, start)

    def history_len(self, conversation_id: str) -> int:
        return reads.history_len(self.redis, conversation_id)

    # -- writers (writes.py) -----------------------------------------------------------------

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
        turn is in flight raises TurnInFlight; one past the size cap raises ConversationFull; near
        Redis's memory limit, StoreFull; a conversation whose version is not a number raises
        UnreadableState. Whatever is refused, nothing is written.
        """
        self.check_room()
        return self._writes.begin_turn(conversation_id, turn_id, user_message, doc, ttl_s=ttl_s or self.ttl_s,
                                       must_exist=must_exist, max_bytes=self.max_conversation_bytes,
                                       person=self.person, max_turns=self.max_turns)

    def check_room(self) -> None:
        """Raise StoreFull when Redis has a memory limit and is past NEW_TURNS_UP_TO of it."""
        self.room.check()

    def publish(
        self, conversation_id: str, turn_id: str, doc: TurnDoc, *, done: bool = False,
        new_messages: list[Message] = (), new_steps: list[Step] = (), expected_history_len: int = -1,
        summary: TurnSummary | None = None, end_live: int = 0, owner: str = "",
    ) -> int:
        """One atomic write: append what is new, replace the small fields, bump the version.

        `end_live` (a live text's seq, 0 for none) clears that live text in the same write, and refuses
        any later live write for it; an ending (done) clears whatever live text there is. A write the
        contract forbids raises StoreError (GONE, STALE, CLOSED or CONFLICT). `owner`: the writing job's id,
        refused (STALE) once the turn was resumed by another job; "" (a front end) writes for any job."""
        return self._writes.publish(conversation_id, turn_id, doc, ttl_s=self.ttl_s, done=done,
                                    new_messages=new_messages, new_steps=new_steps,
                                    expected_history_len=expected_history_len, summary=summary, end_live=end_live,
                                    owner=owner, person=self.person)

    def write_live(self, conversation_id: str, turn_id: str, head: LiveHead, text: str, *,
                   from_bytes: int | None = None, owner: str = "") -> str:
        """Write the live text: the whole of it, or (`from_bytes`) the part that follows the stored
        text's first `from_bytes` bytes. Returns "ok", "ended" (its text was already cleared: nothing
        written) or "lag" (the stored text does not end at `from_bytes`: nothing written)."""
        return self._writes.write_live(conversation_id, turn_id, head, text, ttl_s=self.ttl_s, from_bytes=from_bytes,
                                       owner=owner)

    def resume(self, conversation_id: str, turn_id: str, lost_owner: str, new_owner: str, *, max_resumes: int,
               alive_ms: int) -> tuple[str, int]:
        """Hand a turn whose worker was lost to a new job, exactly once (see Writes.resume)."""
        return self._writes.resume(conversation_id, turn_id, lost_owner, new_owner, max_resumes=max_resumes,
                                   alive_ms=alive_ms)

    def park(self, conversation_id: str, turn_id: str, owner: str, doc: TurnDoc, *, request_id: str,
             expires_at: float, ttl_s: int, hold: bool = False) -> int:
        """Park the turn on a request for approval: the job `owner` lets go of it (see Writes.park)."""
        return self._writes.park(conversation_id, turn_id, owner, doc, request_id=request_id, expires_at=expires_at,
                                 ttl_s=max(ttl_s, self.ttl_s), hold=hold)

    def answer(self, conversation_id: str, turn_id: str, request_id: str, doc: TurnDoc, step: Step, *,
               new_owner: str, ttl_s: int) -> tuple[str, int]:
        """Answer a parked turn's request once; the job `new_owner` continues it (see Writes.answer)."""
        return self._writes.answer(conversation_id, turn_id, request_id, doc, step, new_owner=new_owner,
                                   ttl_s=max(ttl_s, self.ttl_s), person=self.person)

    def delete(self, conversation_id: str) -> bool:
        """Delete a conversation; a turn in flight is asked to stop first, and its later writes are
        refused (GONE), so its job ends without a word. False when there was nothing to delete."""
        if self.person and _text(self.redis.hget(Keys.of(conversation_id).meta, "owned_by")) != self.person:
            return False  # (the script checks it again, in the same step as the delete)
        turn_id = self._writes.turn_in_flight(conversation_id)
        if turn_id is not None:
            self.flags.request_cancel(turn_id, DELETED_MARKER_TTL_S)
        return self._writes.delete(conversation_id, self.person)

    def was_deleted(self, conversation_id: str) -> bool:
        """True when the conversation was deleted (recently), rather than expired or never there."""
        return self._writes.was_deleted(conversation_id, self.person)

    def rename(self, conversation_id: str, title: str) -> bool:
        """Give a conversation a new title (cleaned and cut like any title); False when it does not exist."""
        return self._writes.rename(conversation_id, title, self.person)

    # -- per-turn flags (flags.py) -----------------------------------------------------------

    def claim_turn(self, turn_id: str, job_id: str, ttl_s: int) -> bool:
        """The first job to run a turn claims it; a duplicate or a re-run finds it taken."""
        return self.flags.claim_turn(turn_id, job_id, ttl_s)

    def request_cancel(self, turn_id: str, ttl_s: int, conversation_id: str = "") -> None:
        """Ask the turn to stop; a person's store asks only for a turn of a conversation of theirs."""
        if self.person:
            state = self.read_meta(conversation_id) if conversation_id else None
            if not self.owns(state) or state["turn_id"] != turn_id:
                return
        self.flags.request_cancel(turn_id, ttl_s)

    def cancel_requested(self, turn_id: str) -> bool:
        return self.flags.cancel_requested(turn_id)


def _text(value) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
