"""Tools that ask a person first: the turn parks on a request for approval, frees its worker, and goes on in
a new job once the request is answered, or expires.

Which tools ask: those in the turn's AGENT_APPROVE_TOOLS, and those their source marks (a function's
`needs_approval = True`, an MCP tool that says it is destructive; agent/tools/registry.py).

Parking (`park`): the calls of the same reply that need no approval have run; the job writes the request
into the state (`approval`, status `awaiting_approval`, `done` false) and lets go of the turn in the same
atomic step (scripts/park.lua), then returns: its worker is free for other turns, and no clock of that job
runs on while a person reads. With safeguards off the job waits for the answer itself, holding its worker,
and the queue's job timeout kills it while it waits: the contrast the clocks exist for.

Answering (`answer`): the page, the command line, or the pool's supervisors once the request expires
(`expire_due`, from the watch in agent/hosting/turn_watch.py, so no page needs to be open). One atomic step
takes the answer once (scripts/answer.lua): a second answer finds it taken and is told how it was answered.
The answer is recorded as a step (kind `approval`, from the request to the answer, with the clocks of the job
that parked), and a continuation is enqueued with a fresh set of clocks: a new deadline and job timeout,
the same rules. It runs the approved tool, or gives the model a result that says a person declined it, or
that nobody answered in time (expired: not a decline), and the turn goes on to an answer.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from rq import Queue

from agent.contract import Approval, Kind, Outcome, State, Status, carried, make_step
from agent.conversation.errors import StoreError
from agent.conversation.store import Store
from agent.providers.base import ToolCall
from agent.settings import TurnConfig, least_state_ttl_s
from agent.text.visible import visible_json
from agent.tools.registry import ToolError, decode_arguments
from agent.turn import continuations
from agent.turn.exits import TurnClosed
from agent.turn.writer import StateWriter

log = logging.getLogger(__name__)

MAX_SHOWN_CHARS = 16_000  # characters of a call's arguments as shown to a person; longer ones are refused unasked
MAX_EXPIRED_PER_LOOK = 100  # requests expired (and continuations looked for) per look of one supervisor
WAIT_POLL_S = 0.5  # seconds between looks for the answer, when the job waits for it itself (safeguards off)
# Who answered, in words: the page and the command line say so; an expiry is nobody.
BY_PAGE, BY_CLI, BY_NOBODY = "on the page", "from the command line", "nobody: it expired"

DENIED_RESULT = "Error: not run: a person declined this tool call. Do not try it again; answer without it."


def expired_result(timeout_s: float) -> str:
    return (f"Error: not run: nobody answered the request to approve this tool call within {_duration(timeout_s)}, "
            "so it expired. Nobody declined it. Answer without it, and say that it was not done.")


class TurnParked(Exception):  # noqa: N818 - not an error: the loop's way out while a person decides
    """The turn waits for a person's answer to `call`: the job parks it and leaves."""

    def __init__(self, call: ToolCall):
        super().__init__(call.name)
        self.call = call


def shown_arguments(call: ToolCall) -> str:
    """A call's arguments as a person is asked to approve them: exactly what the tool receives (decoded:
    a key given twice once, with the value the tool gets), whole, with every character a reader would
    not see shown as its escape. ToolError when they cannot be: not a JSON object, or longer than
    MAX_SHOWN_CHARS once shown (the call is then refused, and nobody is asked)."""
    shown = visible_json(decode_arguments(call.name, call.arguments))
    if len(shown) > MAX_SHOWN_CHARS:
        raise ToolError(f"the arguments for {call.name} are {len(shown):,} characters as a person would be shown "
                        f"them, and at most {MAX_SHOWN_CHARS:,} can be shown whole")
    return shown


def refusal_unless_shown(call: ToolCall) -> str | None:
    """The error a call that asks a person first gets instead, when its arguments cannot be shown to them
    whole and exactly as the tool would receive them; None when they can."""
    try:
        shown_arguments(call)
    except ToolError as exc:
        return (f"Error: not run, and nobody was asked to approve it: {exc}. Send the call again with arguments "
                "that can be shown whole.")
    return None


def request_for(call: ToolCall, config: TurnConfig, now: float, steps_before: int) -> Approval:
    """A new request for approval of `call`, expiring AGENT_APPROVAL_TIMEOUT from now, with its arguments
    as the tool receives them (shown_arguments: a call whose arguments cannot be shown never asks)."""
    return Approval(id=secrets.token_hex(8), call_id=call.id, name=call.name,
                    arguments=shown_arguments(call), asked_at=now,
                    expires_at=now + config.approval_timeout_s, answer=None, answered_at=None, answered_by=None,
                    job_id=None, steps_before=steps_before)


def park(writer: StateWriter, call: ToolCall, config: TurnConfig, *, hold: bool = False) -> Approval:
    """Write what is pending, then the request, and let go of the turn (`hold`: keep it, and wait in the job).
    TurnClosed when the turn was ended, or taken over, elsewhere."""
    writer.set_current(None)
    writer.flush()
    request = request_for(call, config, writer.clock(), writer.step_index)
    writer.doc.update(status=Status.AWAITING_APPROVAL, approval=request)
    try:
        writer.store.park(writer.conversation_id, writer.turn_id, writer.writer_job, writer.doc,
                          request_id=request["id"], expires_at=request["expires_at"], ttl_s=_ttl_s(config), hold=hold)
    except StoreError as exc:
        raise TurnClosed(str(exc)) from exc
    writer.last_write_at = writer.clock()
    log.info("turn %s: parked on a request to approve %s (expires in %.0f s)", writer.turn_id, call.name,
             config.approval_timeout_s)
    return request


def wait_for_answer(writer: StateWriter, request: Approval, stops) -> str:
    """Safeguards off: the job itself waits for the answer, holding its worker (until its job timeout)."""
    while True:
        stops.check()
        state = writer.store.read_meta(writer.conversation_id)
        approval = (state or {}).get("approval") or {}
        if approval.get("id") == request["id"] and approval.get("answer"):
            writer.doc.update(status=Status.RUNNING, approval=approval)
            return approval["answer"]
        time.sleep(WAIT_POLL_S)


@dataclass(frozen=True)
class Answered:
    """What became of an answer: `outcome` "ok", "answered" (it was answered already, or expired), "none"
    (nothing to answer, or not that request), "read-only" (someone else's conversation) or "gone" (no such
    conversation), and one sentence that says so."""

    outcome: str
    message: str
    queued: bool = True  # taken, and its continuation is on the queue (False: the pool's watch queues it)

    @property
    def taken(self) -> bool:
        return self.outcome == "ok"


READ_ONLY = ("This conversation is read-only for you: it belongs to someone else, and only they can answer its "
             "request for approval.")


def answer(store: Store, queue: Queue, conversation_id: str, decision: str, by: str, *,
           request_id: str | None = None, now: float | None = None) -> Answered:
    """Answer the conversation's pending request (`request_id`: only that one) with an Outcome in ANSWERS.

    The answer is recorded first (scripts/answer.lua: once, and a person's only before the request expires by
    Redis's clock), then its continuation is enqueued: should that enqueue fail (Redis full, or gone, in
    between), the answer stands and the pool's watch enqueues the continuation (continuations.py)."""
    now = time.time() if now is None else now
    state = store.read_meta(conversation_id)
    if state is None:
        return Answered("gone", f"No conversation {conversation_id} (it expired, or was deleted).")
    if not store.owns(state):
        return Answered("read-only", READ_ONLY)
    request = state.get("approval")
    if (state["done"] or state["status"] != Status.AWAITING_APPROVAL or not request or request.get("answer")
            or (request_id is not None and request.get("id") != request_id)):
        return not_pending(store, conversation_id, state, request_id)
    config = TurnConfig.from_dict(state["config"] or {})
    answered = Approval(**{**request, "answer": decision, "answered_at": now, "answered_by": by})
    doc = carried(state)
    if config.safeguards:  # a continuation, on a fresh set of clocks, owns the turn from here
        answered["job_id"] = new_writer = continuations.continuation_id(state["turn_id"], request["id"])
        doc.update(status=Status.QUEUED, job_id=new_writer, enqueued_at=now, started_at=None, deadline_at=None,
                   job_timeout_at=None, current_step=None)
    else:  # the job that asked waits for the answer itself, and goes on with it
        new_writer = state["job_id"] or ""
        doc.update(status=Status.RUNNING)
    doc["approval"] = answered
    step = make_step(state["turn_id"], request.get("steps_before", 0) + 1, Kind.APPROVAL, request["name"],
                     request["asked_at"], now, decision, deadline_at=state["deadline_at"],
                     job_timeout_at=state["job_timeout_at"], answered_by=by, call_id=request["call_id"],
                     request_id=request["id"],
                     arguments=request["arguments"], detail=_detail(decision, by, now - request["asked_at"]))
    outcome, _ = store.answer(conversation_id, state["turn_id"], request["id"], doc, step, new_writer=new_writer,
                              ttl_s=least_state_ttl_s(config), decision=decision,
                              look_at=now + continuations.GRACE_S if config.safeguards else None)
    if outcome == "late":  # expired by Redis's clock, not yet by the watch: it is expired here, as the watch would
        answer(store, queue, conversation_id, Outcome.EXPIRED, BY_NOBODY, request_id=request["id"])
        return Answered("answered", f"Too late: the request to approve {request['name']} expired before this answer "
                                    "came (nobody answered in time), so the tool was not run.")
    if outcome == "gone" and store.read_meta(conversation_id) is not None:
        return Answered("read-only", READ_ONLY)
    if outcome != "ok":
        return not_pending(store, conversation_id, store.read_meta(conversation_id), request_id)
    log.info("turn %s: the request to approve %s was %s (%s)", state["turn_id"], request["name"], decision, by)
    if config.safeguards and not continuations.enqueue(store, queue, conversation_id, state, new_writer, config):
        return Answered("ok", f"{_WORDS[decision].capitalize()}: {request['name']}. The answer is recorded; Redis "
                              "refused its job for now, and the pool's watch queues it once Redis takes it.",
                        queued=False)
    return Answered("ok", f"{_WORDS[decision].capitalize()}: {request['name']}. The turn goes on.")


def expire_due(store: Store, queue: Queue, now: float | None = None) -> int:
    """Expire every request whose time is up (the oldest first), and enqueue again the continuations the queue
    never got (continuations.requeue_stranded); returns how many requests were expired."""
    now = time.time() if now is None else now
    expired = 0
    for conversation_id in store.flags.approvals_due(now, MAX_EXPIRED_PER_LOOK):
        result = answer(store, queue, conversation_id, Outcome.EXPIRED, BY_NOBODY, now=now)
        if result.taken:
            expired += 1
        elif result.outcome != "read-only":  # answered, ended or gone meanwhile without its entry removed
            store.flags.not_parked(conversation_id)
    continuations.requeue_stranded(store, queue, MAX_EXPIRED_PER_LOOK, now)
    return expired


def not_pending(store: Store, conversation_id: str, state: State | None, request_id: str | None = None) -> Answered:
    """Why there is nothing to answer (`request_id`: that request) in the conversation whose state is `state`."""
    if state is None:
        return Answered("gone", f"No conversation {conversation_id} (it expired, or was deleted).")
    request = state.get("approval")
    if request and request.get("answer") and (request_id is None or request.get("id") == request_id):
        return _answered_already(request)
    if request_id is not None:  # a named request: answered earlier (its step says how), or not this turn's
        earlier = _answer_step(store.read(conversation_id), request_id)
        if earlier is not None:
            return _answered_already({"name": earlier.get("name"), "answer": earlier.get("outcome"),
                                      "answered_by": earlier.get("answered_by")}, request_id)
        if (request and not request.get("answer") and not state["done"]
                and state["status"] == Status.AWAITING_APPROVAL):
            return Answered("none", f"Request {request_id} is not the one waiting: the turn waits for request "
                                    f"{request['id']} (to run {request['name']}); see it before you answer it.")
        return Answered("none", f"Nothing to answer: no request {request_id} is waiting in this conversation.")
    return Answered("none", "Nothing to answer: the conversation's turn is not waiting for an approval.")


def _answered_already(request: dict, request_id: str | None = None) -> Answered:
    which = f"request {request_id} to approve" if request_id else "request to approve"
    if request.get("answer") == Outcome.EXPIRED:
        return Answered("answered", f"The {which} {request.get('name')} expired (nobody answered in time): it can "
                                    "no longer be answered.")
    return Answered("answered", f"The {which} {request.get('name')} was already answered: "
                                f"{_WORDS.get(request.get('answer'), request.get('answer'))} "
                                f"{request.get('answered_by')}.")


def _answer_step(state: State | None, request_id: str) -> dict | None:
    return next((step for step in (state or {}).get("steps") or []
                 if step.get("kind") == Kind.APPROVAL and step.get("request_id") == request_id), None)


_WORDS = {Outcome.APPROVED: "approved", Outcome.DENIED: "declined", Outcome.EXPIRED: "expired"}


def _detail(decision: str, by: str, waited_s: float) -> str:
    if decision == Outcome.EXPIRED:
        return f"nobody answered within {_duration(waited_s)}: the request expired (not declined)"
    return f"{_WORDS[decision]} {by} after {_duration(waited_s)}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _ttl_s(config: TurnConfig) -> int:
    """A parked conversation outlives its request, and then its continuation's longest wait."""
    return int(config.approval_timeout_s) + least_state_ttl_s(config)
