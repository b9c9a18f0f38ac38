"""The conversation state in Redis: versions, TTL, one turn at a time. The object it reads back
is the state contract (agent/contract.py); the keys it keeps are listed in keys.py.

`Store` is the one door: every reader and writer of a conversation, of the index and of the turn
flags goes through it (its readers in StoreReads, which it extends), and it composes the parts that
do the work:

    reads.py    the cheap poll, the blocking wait, the whole state, only what is new since a read
    writes.py   a turn begun, published, its live text; rename and delete (each a script in scripts/)
    room.py     new turns refused near Redis's memory limit (StoreFull)
    index.py    the conversations' index and the list's summaries (store.index)
    flags.py    who runs a turn, Stop asked, a queued job seen missing from its queue (store.flags)
    errors.py   what it refuses, under one root: StoreRefused

A Store reads and writes every conversation, as the machine's operator does (the local playground, the
CLI, the workers). One signed-in person's door is a PersonStore (person_store.py): their conversations
only, each write checked in its script against the conversation's `owned_by`.

The live text is append-only while the same text (same seq) continues, so a reader that has its
first N bytes fetches only the rest (GETRANGE from N). The publish that appends the completed
message, or records the cut call's step, clears it in the same script; `live_ended` in meta is the
last seq cleared, so a late live write for a text already ended is refused.

A poll that finds no change is one HGET of `version`; a publish appends only what is new.
"""

from __future__ import annotations

import redis

from agent.contract import Message, State, Step, TurnDoc, TurnSummary
from agent.conversation import people, reads, tree
from agent.conversation.flags import Flags
from agent.conversation.index import ConversationIndex
from agent.conversation.keys import INDEX_KEY, Keys
from agent.conversation.room import Room
from agent.conversation.writes import DELETED_MARKER_TTL_S, LiveHead, NoRoom, Writes

# The most one conversation keeps (messages, steps and turn summaries, as stored JSON): past it, the
# next message is refused (ConversationFull). A turn in flight is never cut short by it, so a
# conversation can pass it by at most one turn's worth.
DEFAULT_MAX_CONVERSATION_BYTES = 8 * 1024 * 1024  # bytes


class StoreReads:
    """The store's readers (reads.py) on one client: what every tab's poll and every follower use."""

    def __init__(self, client: redis.Redis):
        self.redis = client

    def version(self, conversation_id: str) -> int | None:
        """The cheap poll: one small read. UnreadableState when what is stored is not a version."""
        return reads.version(self.redis, conversation_id)

    def wait_version(self, conversation_id: str, seen: int | None, timeout_ms: int) -> int | None:
        """Block until the version is past `seen` (or the timeout, at most MAX_BLOCK_MS), then return it."""
        return reads.wait_version(self.redis, conversation_id, seen, timeout_ms)

    def read(self, conversation_id: str, *, tip: str = "") -> State | None:
        """The whole state object of the contract (the branch shown; `tip`: the path to that turn), or None when
        unknown or expired."""
        return reads.read(self.redis, conversation_id, tip=tip)

    def read_since(self, conversation_id: str, known: State | None) -> State | None:
        """The whole state object, fetching only what was appended since `known` (an earlier read)."""
        return reads.read_since(self.redis, conversation_id, known)

    def read_meta(self, conversation_id: str) -> State | None:
        """The small fields only (no history, steps or live text)."""
        return reads.read_meta(self.redis, conversation_id)

    def live_seq(self, conversation_id: str) -> int:
        """The seq of the conversation's latest live text (0: none yet in this turn)."""
        seq = self.redis.hget(Keys.of(conversation_id).meta, "live_seq")
        return int(seq) if seq and seq.isdigit() else 0

    def turn_messages_since(self, conversation_id: str, turn_id: str, start: int) -> list[Message]:
        """The turn's messages from its `start`-th on (0: its person's message)."""
        return reads.turn_messages_since(self.redis, conversation_id, turn_id, start)

    def turn_message(self, conversation_id: str, turn_id: str) -> Message | None:
        """The message a turn answers (its person's), or None when the conversation has no such turn."""
        return reads.turn_message(self.redis, conversation_id, turn_id)

    def branches(self, conversation_id: str) -> dict | None:
        """The conversation's whole tree (tree.py), or None when unknown or expired."""
        return tree.branches(self.redis, conversation_id)


class Store(StoreReads):
    """Conversations in Redis, read and written as the state contract; refusals raise StoreRefused."""

    def __init__(self, client: redis.Redis, ttl_s: int, *,
                 max_conversation_bytes: int = DEFAULT_MAX_CONVERSATION_BYTES):
        super().__init__(client)
        self.ttl_s = ttl_s  # a turn's job may lengthen it for the writes it makes
        self.max_conversation_bytes = max_conversation_bytes  # 0: no cap
        self.index = ConversationIndex(client, INDEX_KEY)
        self.flags = Flags(client)
        self.room = Room(client)
        self._writes = Writes(client)  # its scripts registered once, on this client

    # Whose door this is: everyone's (a PersonStore is one signed-in person's). The writes pass `person` to
    # their scripts, which check it against the conversation's `owned_by` ("": no check).
    person = ""
    sees_all = True  # reads every conversation
    max_turns = 0  # turns in flight at most, per person (0: any number)

    def owns(self, state: State | None) -> bool:
        """Whether this store may write to the conversation: the operator may write any."""
        return state is not None

    def owner_email(self, person_id: str) -> str | None:
        """The email a conversation's owner signed in with (see people.py), or None."""
        return people.email_of(self.redis, person_id)

    # -- writers (writes.py) -----------------------------------------------------------------

    def begin_turn(
        self, conversation_id: str, turn_id: str, user_message: Message, doc: TurnDoc, *, ttl_s: int | None = None,
        must_exist: bool = False, branch_of: str = "",
    ) -> tuple[bool, int]:
        """Add the turn (its user's message) to the tree, show it and mark it queued. Returns (new, version).

        Its parent is the turn shown; `branch_of` (a regenerate or an edit of that turn): that turn's parent, so the
        new turn is its sibling, and shown (NoSuchTurn when there is no such turn).

        `ttl_s` (default: the store's) is the conversation's TTL while the turn waits for a worker.
        `must_exist`: the sender believes the conversation exists (an open tab, `--conversation`);
        if it has expired or was deleted meanwhile, ConversationGone is raised instead of quietly
        starting a new conversation under the same id.

        The same turn id again (a double submit) is not a new turn; a different one while a
        turn is in flight raises TurnInFlight; one past the size cap raises ConversationFull; near
        Redis's memory limit, StoreFull; a conversation whose version is not a number raises
        UnreadableState. Whatever is refused, nothing is written.
        """
        reserve_room = self.check_room()
        try:
            return self._writes.begin_turn(conversation_id, turn_id, user_message, doc, ttl_s=ttl_s or self.ttl_s,
                                           must_exist=must_exist, max_bytes=self.max_conversation_bytes,
                                           person=self.person, max_turns=self.max_turns, reserve_room=reserve_room,
                                           branch_of=branch_of)
        except NoRoom:
            raise self.room.refused() from None

    def check_room(self) -> int:
        """Raise StoreFull when Redis has a memory limit and is past NEW_TURNS_UP_TO of it; else the bytes
        left for the reservations of the turns in flight (room.py)."""
        return self.room.check()

    def publish(
        self, conversation_id: str, turn_id: str, doc: TurnDoc, *, done: bool = False,
        new_messages: list[Message] = (), new_steps: list[Step] = (), expected_turn_len: int = -1,
        summary: TurnSummary | None = None, end_live: int = 0, owner: str = "",
    ) -> int:
        """One atomic write: append what is new, replace the small fields, bump the version.

        `expected_turn_len`: the turn's messages the writer knows are stored (its person's included; -1: any):
        CONFLICT when the turn has another number. `end_live` (a live text's seq, 0 for none) clears that live
        text in the same write, and refuses any later live write for it; an ending (done) clears whatever live
        text there is. A write the contract forbids raises StoreError (GONE, STALE, CLOSED or CONFLICT).
        `owner`: the writing job's id, refused (STALE) once the turn was resumed by another job; "" (a front
        end) writes for any job."""
        return self._writes.publish(conversation_id, turn_id, doc, ttl_s=self.ttl_s, done=done,
                                    new_messages=new_messages, new_steps=new_steps,
                                    expected_turn_len=expected_turn_len, summary=summary, end_live=end_live,
                                    owner=owner, person=self.person)

    def write_live(self, conversation_id: str, turn_id: str, head: LiveHead, text: str, *,
                   from_bytes: int | None = None, owner: str = "") -> str:
        """Write the live text: the whole of it, or (`from_bytes`) the part that follows the stored
        text's first `from_bytes` bytes. Returns "ok", "ended" (its text was already cleared: nothing
        written) or "lag" (the stored text does not end at `from_bytes`: nothing written)."""
        return self._writes.write_live(conversation_id, turn_id, head, text, ttl_s=self.ttl_s, from_bytes=from_bytes,
                                       owner=owner)

    def resume(self, conversation_id: str, turn_id: str, lost_owner: str, new_owner: str, *, max_resumes: int,
               alive_ms: int, by_itself: bool = False) -> tuple[str, int]:
        """Hand a turn whose worker was lost to a new job, exactly once (see Writes.resume). `by_itself`: the
        lost job's heartbeat mark is no sign of life (its app is stopping, or its process was seen to end)."""
        return self._writes.resume(conversation_id, turn_id, lost_owner, new_owner, max_resumes=max_resumes,
                                   alive_ms=alive_ms, by_itself=by_itself)

    def park(self, conversation_id: str, turn_id: str, owner: str, doc: TurnDoc, *, request_id: str,
             expires_at: float, ttl_s: int, hold: bool = False) -> int:
        """Park the turn on a request for approval: the job `owner` lets go of it (see Writes.park)."""
        return self._writes.park(conversation_id, turn_id, owner, doc, request_id=request_id, expires_at=expires_at,
                                 ttl_s=max(ttl_s, self.ttl_s), hold=hold)

    def answer(self, conversation_id: str, turn_id: str, request_id: str, doc: TurnDoc, step: Step, *,
               new_owner: str, ttl_s: int, decision: str = "", look_at: float | None = None) -> tuple[str, int]:
        """Answer a parked turn's request once; the job `new_owner` continues it (see Writes.answer)."""
        return self._writes.answer(conversation_id, turn_id, request_id, doc, step, new_owner=new_owner,
                                   ttl_s=max(ttl_s, self.ttl_s), person=self.person, decision=decision,
                                   look_at=look_at)

    def delete(self, conversation_id: str) -> bool:
        """Delete a conversation; a turn in flight is asked to stop first, and its later writes are
        refused (GONE), so its job ends without a word. False when there was nothing to delete."""
        turn_id = self._writes.turn_in_flight(conversation_id)
        if turn_id is not None:
            self.flags.request_cancel(turn_id, DELETED_MARKER_TTL_S)
        deleted = self._writes.delete(conversation_id, self.person)
        if deleted and turn_id is not None:  # its ending will never be written: nothing to reserve memory for
            self.flags.release_reservation(conversation_id, turn_id)
        return deleted

    def switch(self, conversation_id: str, turn_id: str) -> str:
        """Show the branch through `turn_id`, down to its latest turn: every reader of the conversation follows
        (its version moves), and the next message continues it. Returns the turn shown now. Refused while a turn
        is in flight or parked (TurnInFlight: Stop it first), NoSuchTurn, ConversationGone."""
        return self._writes.switch(conversation_id, turn_id, self.person)

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
        """Ask the turn (of `conversation_id`, which a person's door checks) to stop at its next check."""
        self.flags.request_cancel(turn_id, ttl_s)

    def cancel_requested(self, turn_id: str) -> bool:
        return self.flags.cancel_requested(turn_id)

