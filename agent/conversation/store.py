"""The conversation state in Redis: versions, TTL, one turn at a time. The object it reads back
is the state contract (agent/contract.py); the keys it keeps are listed in keys.py.

`Store` is the one door: every reader and writer of a conversation, of the index and of the turn
flags goes through it (its readers in StoreReads, which it extends), and it composes the parts that
do the work:

    reads.py    the cheap poll, the blocking wait, the whole state, only what is new since a read
    tree.py     the whole tree of turns (`branches`)
    writes.py   a turn begun, published, its live text, parked, answered, resumed; the branch shown; rename and
                delete (each a script in scripts/): mixed in, so the store has them as its own
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

from agent.contract import Message, State, TurnDoc
from agent.conversation import people, reads, tree
from agent.conversation.flags import Flags
from agent.conversation.index import ConversationIndex
from agent.conversation.keys import INDEX_KEY, Keys
from agent.conversation.lua import Scripts
from agent.conversation.room import Room
from agent.conversation.writes import DELETED_MARKER_TTL_S, NoRoom, Writes

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


class Store(StoreReads, Writes):
    """Conversations in Redis, read and written as the state contract; refusals raise StoreRefused. Its writers
    are writes.py's (one script each); what it adds before a script is here."""

    def __init__(self, client: redis.Redis, ttl_s: int, *,
                 max_conversation_bytes: int = DEFAULT_MAX_CONVERSATION_BYTES):
        super().__init__(client)
        self.ttl_s = ttl_s  # a turn's job may lengthen it for the writes it makes
        self.max_conversation_bytes = max_conversation_bytes  # 0: no cap
        self.index = ConversationIndex(client, INDEX_KEY)
        self.flags = Flags(client)
        self.room = Room(client)
        self.scripts = Scripts.register(client)  # once, on this client

    # Whose door this is: everyone's (a PersonStore is one signed-in person's). The writes pass `person` to
    # their scripts, which check it against the conversation's `owned_by` ("": no check).
    person = ""
    sees_all = True  # reads every conversation
    max_turns = 0  # turns in flight at most, per person (0: any number)

    def owns(self, state: State | None) -> bool:
        """Whether this store may write to the conversation: the operator may write any."""
        return state is not None

    def owner_email(self, person_id: str) -> str | None:
        """The email a conversation's owner (a person) signed in with (see people.py), or None."""
        return people.email_of(self.redis, person_id)

    # -- writers (writes.py), with what comes before their script -----------------------------

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
        turn is in flight (or parked) raises TurnInFlight; one past the size cap raises ConversationFull; near
        Redis's memory limit, StoreFull; a conversation whose version is not a number raises
        UnreadableState. Whatever is refused, nothing is written.
        """
        reserve_room = self.check_room()
        try:
            return self._begin(conversation_id, turn_id, user_message, doc, ttl_s=ttl_s or self.ttl_s,
                               must_exist=must_exist, reserve_room=reserve_room, branch_of=branch_of)
        except NoRoom:
            raise self.room.refused() from None

    def check_room(self) -> int:
        """Raise StoreFull when Redis has a memory limit and is past NEW_TURNS_UP_TO of it; else the bytes
        left for the reservations of the turns in flight (room.py)."""
        return self.room.check()

    def delete(self, conversation_id: str) -> bool:
        """Delete a conversation, every branch; a turn in flight is asked to stop first, and its later writes are
        refused (GONE), so its job ends without a word. False when there was nothing to delete."""
        turn_id = self.turn_in_flight(conversation_id)
        if turn_id is not None:
            self.flags.request_cancel(turn_id, DELETED_MARKER_TTL_S)
        deleted = self._delete_keys(conversation_id)
        if deleted and turn_id is not None:  # its ending will never be written: nothing to reserve memory for
            self.flags.release_reservation(conversation_id, turn_id)
        return deleted

    # -- per-turn flags (flags.py) -----------------------------------------------------------

    def claim_turn(self, turn_id: str, job_id: str, ttl_s: int) -> bool:
        """The first job to run a turn claims it; a duplicate or a re-run finds it taken."""
        return self.flags.claim_turn(turn_id, job_id, ttl_s)

    def request_cancel(self, turn_id: str, ttl_s: int, conversation_id: str = "") -> None:
        """Ask the turn (of `conversation_id`, which a person's door checks) to stop at its next check."""
        self.flags.request_cancel(turn_id, ttl_s)

    def cancel_requested(self, turn_id: str) -> bool:
        return self.flags.cancel_requested(turn_id)
