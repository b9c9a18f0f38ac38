"""What the store refuses, as one tree: a caller catches the root, a branch, or one refusal by name.

    StoreRefused              the store said no (a Redis that is away or full raises redis's own errors)
    ├── UnreadableState       what is stored is not a conversation this app wrote
    ├── StoreError            a turn's write was refused: GONE, STALE, CLOSED or CONFLICT (`reason`)
    └── MessageRefused        a new message was refused, and nothing was sent
        ├── TurnInFlight      the conversation still has a turn in flight
        ├── ConversationGone  the conversation expired or was deleted meanwhile
        ├── ConversationFull  the conversation holds the most one conversation keeps
        ├── TooManyTurns      the signed-in person has AGENT_MAX_TURNS_PER_USER turns in flight already
        ├── DailyBudgetSpent  the signed-in person's budget for the day (AGENT_USER_DAILY_BUDGET_USD) is spent
        └── StoreFull         Redis is close to its memory limit

A conversation that belongs to someone else is refused as one that does not exist (ConversationGone
with `found` false): the refusal says nothing about whether it exists.

Pure: no I/O, no imports from the rest of the project, so the read rule (agent/conversation/well_formed.py) can
raise UnreadableState without importing the store.
"""

from __future__ import annotations

MIB = 1_048_576  # bytes


class StoreRefused(Exception):
    """The root: the store refused a read or a write, and says why in a sentence."""


class UnreadableState(StoreRefused):
    """The conversation's stored state cannot be read as a conversation; `reason` says why, in words."""

    def __init__(self, conversation_id: str, reason: str):
        super().__init__(f"the stored state of conversation {conversation_id} cannot be read: {reason}")
        self.conversation_id = conversation_id
        self.reason = reason


class StoreError(StoreRefused):
    """A write was refused; `reason` is GONE, STALE, CLOSED or CONFLICT."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class MessageRefused(StoreRefused):
    """A new message was refused before anything was written or enqueued; the text says why."""


class TurnInFlight(MessageRefused):
    """The conversation already has a turn in flight; a new message is refused, not queued."""

    def __init__(self, conversation_id: str, turn_id: str):
        super().__init__("a reply is still being written in this conversation: wait for it, or Stop it first")
        self.conversation_id = conversation_id
        self.turn_id = turn_id


class NoSuchTurn(MessageRefused):
    """A regenerate, an edit or a switch named a turn the conversation does not have."""

    def __init__(self, conversation_id: str, turn_id: str):
        super().__init__(f"this conversation has no turn {turn_id[:40]!r}: `branches` lists its turns")
        self.conversation_id = conversation_id
        self.turn_id = turn_id


class ConversationGone(MessageRefused):
    """A message meant for an existing conversation found none: it expired or was deleted, or (`found`
    false) it is not one the sender may write to, which is said exactly as a conversation never there."""

    def __init__(self, conversation_id: str, deleted: bool, *, found: bool = True):
        how = "was not found" if not found else "was deleted" if deleted else "has expired"
        super().__init__(f"this conversation {how}, so your message was not sent")
        self.conversation_id = conversation_id
        self.deleted = deleted and found


class TooManyTurns(MessageRefused):
    """The signed-in person already has as many turns in flight as one person may (AGENT_MAX_TURNS_PER_USER)."""

    def __init__(self, limit: int):
        turns = "turn" if limit == 1 else "turns"
        super().__init__(
            f"you already have {limit} {turns} in flight, the most one person may have at a time "
            "(AGENT_MAX_TURNS_PER_USER), so that everyone gets a worker: send it again when one of them has ended")
        self.limit = limit


class StoreFull(MessageRefused):
    """Redis is close to its memory limit: new turns are refused so that the turns in flight can finish."""

    def __init__(self, used_bytes: int, max_bytes: int):
        super().__init__(
            f"the conversation store is full ({used_bytes / MIB:.0f} of {max_bytes / MIB:.0f} MiB, "
            "AGENT_REDIS_MAXMEMORY_MB): nothing was sent. Delete conversations you no longer need (download "
            "them first to keep them), or raise the limit")
        self.used_bytes = used_bytes
        self.max_bytes = max_bytes


class ConversationFull(MessageRefused):
    """The conversation holds as much as one conversation may keep; a new message is refused."""

    def __init__(self, conversation_id: str, size_bytes: int, max_bytes: int):
        super().__init__(
            f"this conversation holds {size_bytes / MIB:.1f} MiB, the most one conversation keeps "
            f"({max_bytes / MIB:.1f} MiB, AGENT_MAX_CONVERSATION_BYTES): start a new chat, or download "
            "this one first to keep it")
        self.conversation_id = conversation_id
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class DailyBudgetSpent(MessageRefused):
    """The signed-in person's budget for the day is spent (or reserved by their turns in flight)."""

    def __init__(self, spent: str, budget: str, renews: str):
        super().__init__(f"you have spent {spent} of your {budget} for today (AGENT_USER_DAILY_BUDGET_USD, turns in "
                         f"flight counted at their budget); it renews {renews}: send it again then")
        self.renews = renews
