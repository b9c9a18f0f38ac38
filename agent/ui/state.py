"""The page's session logic, without Streamlit: which conversation, its state (fetched only when
its version moved), sending, stopping, the queue, and the never-stuck check.

`session` is any mutable mapping (st.session_state on the page, a dict in tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import redis
from rq import Queue

from agent.contract import State, Status
from agent.conversation.endings import Ending, write_ending
from agent.conversation.errors import MessageRefused, TooManyTurns
from agent.conversation.keys import is_conversation_id
from agent.conversation.listing import retention_words
from agent.conversation.people import Person
from agent.conversation.person_store import PersonStore
from agent.conversation.store import Store
from agent.conversation.well_formed import UnreadableState
from agent.hosting import services
from agent.hosting.lost_worker import lost_worker_check
from agent.queue import (
    MAX_SHARE,
    BadMessage,
    cancel_held,
    get_queue,
    job_status,
    new_id,
    queue_position,
    submit_turn,
    worker_counts,
)
from agent.settings import DEFAULT_WORKERS, Settings, TurnConfig
from agent.text.markdown import inert

CID_PARAM = "c"  # the URL's query parameter that holds the conversation id

VIEW_KEY = "agent_view"  # {"cid", "version", "state"}: the last state read, reused while the version holds
DRAFT_KEY = "agent_draft_cid"  # this tab's id for a chat that has no message yet (not in the URL yet)
FLASH_KEY = "agent_flash"  # a message for the next runs: (kind: info/warning/error, text, unsent text or None)
STOPPING_KEY = "agent_stopping"  # turn id whose stop this tab asked for


@dataclass
class Backend:
    """What the page talks to, made once per process (see shell.backend)."""

    services: services.Services
    store: Store
    queue_connection: redis.Redis
    queue: Queue
    person: Person | None = None  # who is signed in (None: the local playground, no sign-in)
    share: int = 0  # the most of the person's turns queued or running at once (0: no limit; see submit_turn)
    daily_budget_usd: float | None = None  # what the person's turns may spend in a day (AGENT_USER_DAILY_BUDGET_USD)

    def for_person(self, person: Person, settings: Settings) -> Backend:
        """This backend as one signed-in person's: their store is the door to their conversations only."""
        store = PersonStore(self.store, person.id, admin=person.admin, max_turns=settings.max_turns_per_user)
        return replace(self, store=store, person=person, share=min(MAX_SHARE, settings.workers or DEFAULT_WORKERS),
                       daily_budget_usd=settings.daily_budget_usd)


def connect(settings: Settings) -> Backend:
    svc = services.ensure(settings)
    queue_connection = svc.queue_connection()
    return Backend(svc, svc.store(settings), queue_connection, get_queue(queue_connection))


@dataclass
class Conversation:
    id: str
    in_url: bool
    notice: str | None = None  # why the id in the URL was not used
    unreadable: bool = False  # it was not used because its stored state cannot be read
    gone: str = ""  # the notice's verb in brief ("was deleted"), for a toast that agrees with it


def resolve_conversation(url_cid: str | None, session, store: Store, ttl_s: int) -> Conversation:
    """The URL's conversation when it exists; otherwise this tab's draft id (a fresh chat), with a
    notice that says why: deleted, expired while this tab showed it, or never found."""
    if url_cid:
        try:
            if is_conversation_id(url_cid) and store.version(url_cid) is not None:
                return Conversation(url_cid, in_url=True)
        except UnreadableState as exc:
            return _unreadable(url_cid, session, exc)
        session.pop(DRAFT_KEY, None)
        seen = (session.get(VIEW_KEY) or {}).get("cid") == url_cid
        session.pop(VIEW_KEY, None)
        kept = f"conversations are kept for {retention_words(ttl_s)} after their last message"
        if is_conversation_id(url_cid) and store.was_deleted(url_cid):
            what = ("The conversation this tab was showing" if seen
                    else f"The conversation in this link ({inert(url_cid)})")
            gone, notice = "was deleted", f"{what} was deleted (here or in another tab)."
        elif seen:
            gone, notice = "has expired", f"The conversation this tab was showing has expired: {kept}."
        else:
            gone = "was not found"
            notice = f"The conversation in this link ({inert(url_cid[:24])}) was not found: {kept}."
        return Conversation(_draft(session), in_url=False, gone=gone,
                            notice=notice + " Nothing you had not sent is lost: this is a new chat.")
    return Conversation(_draft(session), in_url=False)


def open_conversation(url_cid: str | None, session, store: Store, queue_connection: redis.Redis,
                      ttl_s: int) -> tuple[Conversation, Poll]:
    """The conversation a full run shows, and its state. One whose stored state cannot be read is said
    in a notice, and this tab gets a new chat: the next message goes there, not into it."""
    conversation = resolve_conversation(url_cid, session, store, ttl_s)
    try:
        return conversation, poll(store, queue_connection, session, conversation.id)
    except UnreadableState as exc:
        if not conversation.in_url:
            raise
        conversation = _unreadable(conversation.id, session, exc)
        return conversation, poll(store, queue_connection, session, conversation.id)


def _unreadable(url_cid: str, session, exc: UnreadableState) -> Conversation:
    session.pop(DRAFT_KEY, None)
    session.pop(VIEW_KEY, None)
    notice = (f"The conversation in this link ({inert(url_cid[:24])}) cannot be read: "
              f"{unreadable_sentence(exc)} This is a new chat.")
    return Conversation(_draft(session), in_url=False, notice=notice, unreadable=True, gone="cannot be read")


def unreadable_sentence(exc: UnreadableState) -> str:
    """Why a conversation cannot be read, for the page (the reason may quote what was stored)."""
    return f"its stored state is not one this app wrote ({inert(exc.reason)})."


def _draft(session) -> str:
    if not session.get(DRAFT_KEY):
        session[DRAFT_KEY] = new_id()
    return session[DRAFT_KEY]


def new_chat(session) -> None:
    for key in (DRAFT_KEY, VIEW_KEY, FLASH_KEY, STOPPING_KEY):
        session.pop(key, None)


@dataclass
class Poll:
    state: State | None
    changed: bool  # the version moved since this tab's last read (or there was none)
    lost: bool = False  # this poll found the worker lost and wrote the ending


def poll(store: Store, queue_connection: redis.Redis, session, cid: str, *, wait_ms: int = 0) -> Poll:
    """The cheap poll: one version read; the whole state only when the version moved.

    While a turn is in flight and nothing changed, block up to `wait_ms` on the conversation's
    event stream, so a step shows within milliseconds of its write. When still nothing changed,
    check whether the worker was lost, and if so write the ending (every tab then sees it).
    """
    cached = session.get(VIEW_KEY)
    if cached and cached["cid"] != cid:
        cached = None
    version = store.version(cid)
    if version is None:
        # The view stays: the full run this leads to tells "this tab was showing it" (expired, deleted)
        # from "a link to an unknown conversation" by it, and drops it then.
        return Poll(None, changed=cached is not None)
    in_flight = cached is not None and not cached["state"]["done"]
    if in_flight and version == cached["version"] and wait_ms > 0:
        version = store.wait_version(cid, version, wait_ms)
    if cached is not None and version == cached["version"]:
        state, changed = cached["state"], False
    else:
        state, changed = _read(store, session, cid), True
    lost = False
    # A parked turn has no job to lose (it waits for a person): no check, so it costs what an idle page does.
    # Someone else's turn (an admin reading it) is left to its owner's pages and the pools' watch: this store
    # could not write its ending.
    if state is not None and phase_of(state) == LIVE and (not changed or cached is None) and store.owns(state):
        if lost_worker_check(store, queue_connection, cid, state):
            state, changed, lost = _read(store, session, cid), True, True
    return Poll(state, changed, lost)


IDLE, PARKED, LIVE = "idle", "parked", "live"  # where the conversation's latest turn is, for the page


def phase_of(state: State | None) -> str:
    """The page follows a conversation in one of three ways: idle (nothing in flight, or no state), parked
    (a tool waits for a person's answer: no job runs, so the page waits like an idle one, drawn once) or
    live (a job runs or is queued: the page follows each write)."""
    if state is None or state["done"]:
        return IDLE
    return PARKED if state["status"] == Status.AWAITING_APPROVAL else LIVE


def _read(store: Store, session, cid: str) -> State | None:
    """The state, fetching only what was appended since this tab's last read of it."""
    cached = session.get(VIEW_KEY)
    state = store.read_since(cid, cached["state"] if cached and cached["cid"] == cid else None)
    if state is None:
        session.pop(VIEW_KEY, None)
    else:
        session[VIEW_KEY] = {"cid": cid, "version": state["version"], "state": state}
    return state


def text_only_change(old: State, new: State) -> bool:
    """Only the text being written moved between two reads of one turn: the page redraws that text
    alone, not the turn around it."""
    same = all(old.get(name) == new.get(name) for name in ("turn_id", "status", "done", "current_step", "error"))
    lists = all(len(old.get(name) or []) == len(new.get(name) or []) for name in ("history", "steps"))
    return same and lists and _live_key(old) == _live_key(new)


def _live_key(state: State) -> tuple | None:
    """Which message and try the live text belongs to: a new one (or none) redraws the turn."""
    live = state.get("live")
    return None if not live else (live.get("turn_id"), live.get("message_index"), live.get("attempt"))


def send(store: Store, queue: Queue, session, cid: str, text: str | None, config: TurnConfig | None,
         config_error: str | None = None, share: int = 0, daily_budget_usd: float | None = None,
         branch_of: str = "") -> str | None:
    """Enqueue a turn; on refusal, leave a message (and the unsent text) for the next run. `branch_of` (the
    page's Regenerate and Edit): the new turn is that turn's sibling, as submit_turn says."""
    session.pop(FLASH_KEY, None)
    if config is None:
        session[FLASH_KEY] = ("error", f"Nothing was sent: {config_error or 'fix the settings in the sidebar'}.", text)
        return None
    # A conversation this tab has shown is continued, never started afresh under the same id: if it
    # expired or was deleted meanwhile, the message is refused and kept on screen.
    seen = (session.get(VIEW_KEY) or {}).get("cid") == cid
    try:
        try:
            turn_id = submit_turn(store, queue, cid, text, config, must_exist=seen, share=share,
                                  daily_budget_usd=daily_budget_usd, branch_of=branch_of)
        except TooManyTurns:
            # One of the turns that count may have lost its job with nobody to say so (no tab open on it):
            # its ending is written now, and then the message goes, or is refused for the turns really in flight.
            if not _end_lost_turns(store, queue.connection):
                raise
            turn_id = submit_turn(store, queue, cid, text, config, must_exist=seen, share=share,
                                  daily_budget_usd=daily_budget_usd, branch_of=branch_of)
    except BadMessage as exc:
        session[FLASH_KEY] = ("error", str(exc), text)
        return None
    except MessageRefused as exc:  # in flight, gone, full: said, and the text kept to send again
        session[FLASH_KEY] = ("warning", f"Not sent: {exc}.", text)
        return None
    session.pop(STOPPING_KEY, None)
    return turn_id


def switch(store: Store, session, cid: str, turn_id: str | None) -> str | None:
    """Show the branch through `turn_id` (down to its latest turn): every tab on the conversation follows, as the
    version moves. Refused while a turn is in flight or parked (said, with Stop first), or by someone who does not
    own the conversation. Returns the turn shown then, or None."""
    if not turn_id:
        return None
    session.pop(FLASH_KEY, None)
    try:
        return store.switch(cid, turn_id)
    except MessageRefused as exc:
        session[FLASH_KEY] = ("warning", f"Not switched: {exc}.", None)
    except redis.RedisError as exc:
        session[FLASH_KEY] = ("error", f"Not switched: Redis is not answering ({type(exc).__name__}).", None)
    return None


def _end_lost_turns(store: Store, queue_connection: redis.Redis) -> bool:
    """Write the ending of each of the person's turns in flight whose worker or job was lost; True if any."""
    ended = False
    for cid in dict.fromkeys(store.turns_in_flight()):
        state = store.read_meta(cid)
        if state is not None and not state["done"] and lost_worker_check(store, queue_connection, cid, state):
            ended = True
    return ended


def stop(store: Store, session, state: State, ttl_s: int, queue_connection: redis.Redis | None = None) -> None:
    """Ask the worker to stop at its next check; a turn still waiting in the queue ends at once."""
    turn_id = state["turn_id"]
    if not store.owns(state):  # read-only (an admin's look at someone else's): the store would refuse it too
        return
    store.request_cancel(turn_id, ttl_s, state["conversation_id"])
    session[STOPPING_KEY] = turn_id
    if state["status"] == Status.AWAITING_APPROVAL:  # parked: no job runs to see the stop, so it ends here
        request = state.get("approval") or {}
        write_ending(store, state["conversation_id"], turn_id,
                     Ending.cancelled_awaiting_approval(request.get("name") or "requested"))
        return
    # With safeguards off a running turn writes nothing until it ends, so ask RQ whether it started.
    job = job_status(queue_connection, state["job_id"] or "") if queue_connection is not None else None
    if state["status"] == Status.QUEUED and not state["started_at"] and job in (None, "queued", "rate_limited"):
        # Safe against a worker that picks it up right now: a turn that has ended refuses its writes.
        write_ending(store, state["conversation_id"], turn_id, Ending.cancelled_before_start())
        if job == "rate_limited":  # held behind the person's own turns: out of RQ's waiting set, its place freed
            cancel_held(queue_connection, state["job_id"])


@dataclass
class QueueInfo:
    position: int | None  # 1-based place in the queue, None when not waiting
    workers: int
    busy: int
    job_status: str | None


def queue_info(backend: Backend, state: State) -> QueueInfo:
    job_id = state["job_id"]
    position = queue_position(backend.queue, job_id) if job_id else None
    status = job_status(backend.queue_connection, job_id) if job_id else None
    workers, busy = worker_counts(backend.queue)
    return QueueInfo(position, workers, busy, status)


def now() -> float:
    return time.time()
