"""Every Redis key the project writes, spelled once. Only the store (this package) reads or writes them.

Per conversation (all its keys share one TTL, refreshed on every write):

    agent:conv:{id}:meta     hash: turn_id, done, version, doc (JSON of the small fields), writer (the id
                             of the job that may write the turn; `owner` in the flat shape, below), attempt
                             (0, then 1, 2... per resume),
                             owned_by (the id of the signed-in person who started it; absent in the
                             local playground and for the operator's conversations), step_turn and
                             step_index (the highest step index a job's write stored, and its turn: a
                             write run twice stores no step twice, scripts/publish.lua)
    agent:conv:{id}:tree     hash: the conversation as a tree of turns, each turn a record of its own (its
                             person's message, the messages it produced, its steps, its summary, its parent
                             turn, its children), field by field: scripts/included/tree.lua says which. meta's `tip` is
                             the turn shown (the path from the first turn to it is the state's `history`),
                             `tree_v` +1 whenever a turn is added or another branch is shown, `shape` "tree"
    agent:conv:{id}:history, :steps, :turns
                             lists: a conversation as a release before the tree stored it (the flat shape: one
                             JSON message, step or ended turn's summary per item). Read as they are; the first
                             write moves them into the tree (scripts/included/tree.lua) and deletes them
    agent:conv:{id}:events   stream: one tiny entry per write, id `<version>-1`, so a client can
                             block until the version moves instead of sleeping a poll interval
    agent:conv:{id}:live     string: the text a model call is writing now (UTF-8), grown by APPEND;
                             its head (turn, message index, attempt, status, seq) is `live` in meta;
                             `writer` is "" while the turn is parked on a request for approval

Beside the conversations:

    agent:conversations      sorted set: every conversation id, scored by its last write (epoch s):
                             the sidebar's and `list`'s index (agent/conversation/listing.py), never a key scan
    agent:deleted:{id}       a marker that the conversation was deleted (not expired), for a while
    agent:gone:{id}          stream: one entry, added by the delete, that wakes every reader blocked on
                             the conversation's events at once (a deleted stream wakes no one); it
                             lives a minute
    agent:turn:{turn}:claim  string: the id of the job that runs the turn (the first to claim it)
    agent:turn:{turn}:cancel string "1": Stop was asked for the turn
    agent:turn:{turn}:alive  string: the id of the job running the turn, renewed every HEARTBEAT_S with a
                             TTL of HEARTBEAT_TTL_S (agent/turn/heartbeat.py): lapsed, its worker is lost
    agent:turns:running      sorted set: the conversations whose turn a job has started and not ended,
                             each a lease scored by when it lapses (ms on Redis's clock), renewed with
                             the turn's heartbeat: the pool's supervisors read only the lapsed ones, in
                             one range read (agent/hosting/turn_watch.py), never a key scan
    agent:approvals:pending  sorted set: the conversations whose turn is parked on a request for approval,
                             scored by when the request expires: what the pool's supervisors look at to
                             expire it (agent/turn/approvals.py), never a key scan; the meta hash's
                             `approval` field holds the pending request's id, so an answer is taken once
    agent:approvals:continuing
                             sorted set: the conversations whose request was answered and whose
                             continuation job must still be seen on the queue, scored by when to look:
                             the answer is recorded before its job is enqueued, so a job that never
                             reached the queue (Redis full, or gone, in between) is enqueued again by
                             the pool's watch (agent/turn/approvals.py)
    agent:person:{person}:conversations
                             sorted set: the conversations a signed-in person owns, scored by when they
                             last wrote in them (sent, renamed): that person's list, never a key scan
    agent:person:{person}:turns
                             sorted set: the person's turns in flight (`{conversation} {turn}`), scored by
                             when each began: what AGENT_MAX_TURNS_PER_USER is checked against
    agent:person:{person}:spend:{day}
                             hash: a signed-in person's spend on one UTC day (YYYY-MM-DD), in picodollars:
                             `spent` by turns that ended, `reserved` by turns in flight (their budgets);
                             checked and reserved in one step at send (AGENT_USER_DAILY_BUDGET_USD,
                             agent/conversation/daily.py); kept two days
    agent:turn:{turn}:settled
                             string: the turn's spend was added to its person's day (once, whoever ends it)
    agent:person:{person}    hash: who the person is (issuer, subject, name, email), written at sign-in,
                             for the operator's `--owner`
    agent:people:by-email    hash: an email, lower-cased, to the id of the person who last signed in with it
    agent:signed-out:{sign_in}
                             string: the id of the person who signed out of that sign-in (a digest of its
                             identity claims, agent/conversation/sign_outs.py); while it lives (31 days:
                             longer than the identity cookie's signature holds) the cookie signs nobody in
    agent:job:{job}:off-queue-since
                             string: epoch seconds a queued job was first seen missing from its queue
                             (agent/hosting/lost_worker.py: a worker took it and died before starting it)
    agent:job:{job}:requeued string "1", for a few seconds: a continuation that never reached the queue is
                             being enqueued again, by one watch or front end only (agent/turn/approvals.py)
    agent:memory:reserved    sorted set: the turns accepted and not ended (`{conversation} {turn}`), each
                             holding a reservation of Redis's memory for its final write
                             (agent/conversation/room.py), scored by when the reservation lapses: new turns
                             are refused when they would not fit; a turn's ending releases it, first thing,
                             so that the ending lands even at maxmemory. The pool's watch reads it too, for
                             the accepted turns whose job is gone (agent/hosting/turn_watch.py)
    agent:workers            set: the names of the workers that beat (agent/conversation/workers.py)
    agent:worker:{name}:alive
                             string: the worker's state (`idle`, `busy`, ...), renewed every second with
                             a TTL of 3 s by the worker itself: what the page counts as its workers
    agent:tools:catalogue    string: one JSON document, the tool sources the workers have, for the page
                             (agent/tools/catalogue.py)

The queue's own keys (`rq:*`) belong to RQ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEY_PREFIX = "agent:"
INDEX_KEY = f"{KEY_PREFIX}conversations"
CATALOGUE_KEY = f"{KEY_PREFIX}tools:catalogue"
RUNNING_KEY = f"{KEY_PREFIX}turns:running"
WORKERS_KEY = f"{KEY_PREFIX}workers"
RESERVED_KEY = f"{KEY_PREFIX}memory:reserved"
APPROVALS_KEY = f"{KEY_PREFIX}approvals:pending"
CONTINUING_KEY = f"{KEY_PREFIX}approvals:continuing"
# A conversation id names Redis keys and goes in URLs and command lines: letters, digits, '-' and '_'.
CONVERSATION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
PEOPLE_BY_EMAIL_KEY = f"{KEY_PREFIX}people:by-email"


def is_conversation_id(value) -> bool:
    """The one rule for an id that comes from outside (the page's URL, the CLI's --conversation).

    A whole match: `re.match` with `$` would also take an id followed by a newline."""
    return isinstance(value, str) and CONVERSATION_ID_RE.fullmatch(value) is not None


@dataclass(frozen=True)
class Keys:
    """The keys of one conversation."""

    meta: str
    history: str  # the flat shape's lists (a release before the tree): read, then moved into the tree
    steps: str
    turns: str
    events: str
    live: str
    tree: str
    base: str  # the prefix of them all: the scripts that move the flat shape into the tree build its keys from it

    @classmethod
    def of(cls, conversation_id: str) -> Keys:
        base = f"{KEY_PREFIX}conv:{conversation_id}:"
        return cls(base + "meta", base + "history", base + "steps", base + "turns", base + "events", base + "live",
                   base + "tree", base)

    @property
    def all(self) -> list[str]:
        return [self.meta, self.history, self.steps, self.turns, self.events, self.live, self.tree]


def deleted_marker(conversation_id: str) -> str:
    return f"{KEY_PREFIX}deleted:{conversation_id}"


def gone_events(conversation_id: str) -> str:
    return f"{KEY_PREFIX}gone:{conversation_id}"


def turn_claim(turn_id: str) -> str:
    return f"{KEY_PREFIX}turn:{turn_id}:claim"


def turn_cancel(turn_id: str) -> str:
    return f"{KEY_PREFIX}turn:{turn_id}:cancel"


def job_off_queue_since(job_id: str) -> str:
    return f"{KEY_PREFIX}job:{job_id}:off-queue-since"


def job_requeued(job_id: str) -> str:
    return f"{KEY_PREFIX}job:{job_id}:requeued"


def turn_alive(turn_id: str) -> str:
    return f"{KEY_PREFIX}turn:{turn_id}:alive"


def worker_alive(name: str) -> str:
    return f"{KEY_PREFIX}worker:{name}:alive"


def person_conversations(person_id: str) -> str:
    return f"{KEY_PREFIX}person:{person_id}:conversations"


def person_turns(person_id: str) -> str:
    return f"{KEY_PREFIX}person:{person_id}:turns"


def person_day_spend(person_id: str, day: str) -> str:
    return f"{KEY_PREFIX}person:{person_id}:spend:{day}"


def turn_settled(turn_id: str) -> str:
    return f"{KEY_PREFIX}turn:{turn_id}:settled"


def person_record(person_id: str) -> str:
    return f"{KEY_PREFIX}person:{person_id}"


def signed_out_key(sign_in_id: str) -> str:
    return f"{KEY_PREFIX}signed-out:{sign_in_id}"
