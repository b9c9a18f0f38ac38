"""One signed-in person's door to the store: their conversations only.

A PersonStore is a Store (store.py) that reads only the person's conversations (an admin's reads all),
answers for anyone else's exactly as for one that does not exist, lists from the person's own index,
and refuses a new turn past their share of turns in flight. Its writes pass the person to the write
scripts, which check the conversation's `owned_by` in the same atomic step as the write: a person's
door writes only their own conversations, an admin's included. The page makes one per run for whoever
is signed in (agent/ui/signin.py); the CLI's `--owner` one for the person it names.
"""

from __future__ import annotations

from agent.contract import State
from agent.conversation import reads
from agent.conversation.index import ConversationIndex
from agent.conversation.keys import Keys, person_conversations, person_turns
from agent.conversation.store import Store
from agent.conversation.well_formed import decoded


class PersonStore(Store):
    """`store`'s client and settings, as the door of the person `person_id`."""

    def __init__(self, store: Store, person_id: str, *, admin: bool = False, max_turns: int = 0):
        # The client and the store's parts (its scripts registered once on it) are shared, not made again: the
        # page makes one of these on every run.
        vars(self).update(vars(store))
        self.person, self.sees_all, self.max_turns = person_id, admin, max_turns
        if not admin:  # an admin lists everyone's
            self.index = ConversationIndex(self.redis, person_conversations(person_id))

    def visible(self, state: State | None) -> State | None:
        """The state when this person may read it, else None (as if it did not exist)."""
        if state is None or self.sees_all or state.get("owner") == self.person:
            return state
        return None

    def owns(self, state: State | None) -> bool:
        return state is not None and state.get("owner") == self.person

    def turns_in_flight(self) -> list[str]:
        """The conversations whose turns count against the person's share: some may have ended since (they
        are dropped at the next begin), or have lost their job without an ending."""
        return [decoded(member).partition(" ")[0] for member in self.redis.zrange(person_turns(self.person), 0, -1)]

    # -- readers: someone else's conversation reads as none ----------------------------------

    def version(self, conversation_id: str) -> int | None:
        if self.sees_all:
            return super().version(conversation_id)
        return reads.version(self.redis, conversation_id, owned_by=self.person)  # the same one read

    def wait_version(self, conversation_id: str, seen: int | None, timeout_ms: int) -> int | None:
        version = super().wait_version(conversation_id, seen, timeout_ms)
        return version if self.sees_all else self.version(conversation_id)

    def read(self, conversation_id: str, *, tip: str = "") -> State | None:
        return self.visible(super().read(conversation_id, tip=tip))

    def read_since(self, conversation_id: str, known: State | None) -> State | None:
        return self.visible(super().read_since(conversation_id, known))

    def read_meta(self, conversation_id: str) -> State | None:
        return self.visible(super().read_meta(conversation_id))

    def branches(self, conversation_id: str) -> dict | None:
        return super().branches(conversation_id) if self.read_meta(conversation_id) is not None else None

    def turn_message(self, conversation_id: str, turn_id: str):
        return super().turn_message(conversation_id, turn_id) if self.read_meta(conversation_id) is not None else None

    # -- writers that act before their script: the script checks the owner again ------------------

    def delete(self, conversation_id: str) -> bool:
        if decoded(self.redis.hget(Keys.of(conversation_id).meta, "owned_by") or b"") != self.person:
            return False  # not theirs: not even its turn is asked to stop
        return super().delete(conversation_id)

    def request_cancel(self, turn_id: str, ttl_s: int, conversation_id: str = "") -> None:
        state = self.read_meta(conversation_id) if conversation_id else None
        if self.owns(state) and state["turn_id"] == turn_id:
            super().request_cancel(turn_id, ttl_s, conversation_id)
