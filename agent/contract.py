"""The state contract: the one JSON object every client reads, and the parts it is made of.

The turn job writes it (agent/turn/), the store keeps it (agent/conversation/), and the page, the CLI
and the lost-worker check read it. Every field name, status, step kind and outcome is spelled
here once; the types are TypedDicts, so what Redis holds and what `--json` prints are plain JSON
objects, field for field. The named values are `StrEnum`s: each member is a `str`, so it is written
to JSON as its plain value and compares equal to the string a reader got back from Redis.
Pure: no I/O.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a tool's name as the model sees it: what every provider accepts


class Status(StrEnum):
    """Where a turn is. Once ended, a turn never goes back to in flight."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    # Parked: a tool the model asked for waits for a person's answer (`approval`); `done` stays false
    # and no job runs until the answer (or its expiry) enqueues the turn's continuation.
    AWAITING_APPROVAL = "awaiting_approval"


ENDED_STATUSES = (Status.DONE, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED)


class LiveStatus(StrEnum):
    """Where the text being written (`live`) is. A cut, failed or stopped text is not live any more:
    it is cleared, and its model step keeps it as `partial_text` with the outcome saying why."""

    WRITING = "writing"


class Kind(StrEnum):
    """What a step was."""

    MODEL = "model"  # one model call
    TOOL = "tool"  # one tool run (or the record of refused or never-run calls)
    RETRY = "retry"  # the wait before a retry of a model call
    SKIP = "skip"  # a model call not started: too little time was left
    RESUME = "resume"  # the gap from a lost worker's last write to the job that resumed the turn
    APPROVAL = "approval"  # the wait for a person's answer to a tool that asks first, outside both jobs' clocks


class Outcome(StrEnum):
    """How a step went."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    STOPPED = "stopped"  # at the user's request
    SKIPPED = "skipped"  # never started: the deadline came first
    REFUSED = "refused"  # tool calls past a response's limit
    APPROVED = "approved"  # an approval: a person said yes
    DENIED = "denied"  # an approval: a person said no
    EXPIRED = "expired"  # an approval: nobody answered in time (not a decline)


ANSWERS = (Outcome.APPROVED, Outcome.DENIED, Outcome.EXPIRED)  # how a request for approval can be answered


class ErrorKind(StrEnum):
    """Why a turn ended other than with an answer: its ending's `error.kind` (or a ProviderErrorKind)."""

    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    JOB_TIMEOUT = "job_timeout"
    STEP_LIMIT = "step_limit"
    RETRIES = "retries"
    INTERNAL = "internal"
    SHUTDOWN = "shutdown"
    WORKER = "worker"
    WORKER_LOST = "worker_lost"
    QUEUE_EXPIRED = "queue_expired"
    NOT_QUEUED = "not_queued"  # accepted, but its job could not be put on the queue (Redis refused it)
    EMPTY_REPLY = "empty_reply"  # the model answered with no text and no tool call
    BUDGET = "budget"  # the turn's budget (tokens or US dollars) left no room for a call, not even the answer


class ProviderErrorKind(StrEnum):
    """Why a model call failed: a ProviderError's `kind`, which its ending keeps as `error.kind`."""

    TIMEOUT = "timeout"  # no complete answer within the call's timeout
    CONNECTION = "connection"  # could not connect, or the connection broke (a stream cut off)
    RATE_LIMITED = "rate_limited"  # HTTP 429
    SERVER = "server"  # HTTP 5xx, 408, 409, 529, or a server's error of no known type
    AUTH = "auth"  # no key, a rejected key, or a key that must not be sent
    BAD_REQUEST = "bad_request"  # the provider refused the request (a prompt past its context too), or no such provider
    NOT_FOUND = "not_found"  # HTTP 404: no such model or endpoint
    MALFORMED = "malformed"  # a response that is not what the API promises
    STOPPED = "stopped"  # the call's stop event was set


class Role(StrEnum):
    """A message's role, in the OpenAI chat format the history keeps."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(TypedDict, total=False):
    role: str
    content: str | None
    tool_calls: list[dict]
    tool_call_id: str


class Error(TypedDict):
    kind: str  # an ErrorKind or a ProviderErrorKind
    message: str  # a person can read it


class CurrentStep(TypedDict):
    """The step running now (the page draws it live); None between steps."""

    kind: str
    name: str
    started_at: float
    timeout_s: float | None
    # A tool run's call id. Written before a tool that is not safe to repeat starts, so a resumed turn
    # knows the one call that may have taken effect without a stored result (agent/turn/tool_runs.py)
    call_id: NotRequired[str]


class Usage(TypedDict):
    """Tokens one model call used, as its provider reported them."""

    input_tokens: int | None
    output_tokens: int | None
    cached_input_tokens: NotRequired[int | None]  # of the input, what the provider's cache served


class Spend(TypedDict):
    """A turn's spend against its budget (agent/spend.py): the state's and each turn summary's `spend`.
    Money in US dollars (None: the model has no price), exact in picodollars (`pusd`)."""

    tokens: int  # input + output tokens charged so far: as reported, or a call's worst case where not
    usd: float | None
    pusd: int | None
    budget_tokens: int | None  # None: no token budget
    budget_usd: float | None  # None: no dollar budget
    reserve_tokens: int | None  # kept for the turn's last answer (None: no budget)
    reserve_usd: float | None
    in_flight_tokens: int  # the worst case of the call running now (charged so if its worker is lost)
    in_flight_pusd: int
    checked: str  # "before each call" (the clamp), or "after each call" (safeguards off)


class Live(TypedDict):
    """The text a model call is writing now, beside the history (which gets it when the call completes)."""

    turn_id: str
    message_index: int  # where the message will land in `history`
    attempt: int  # 1 for the first try of this model call; a retry starts a fresh text
    text: str  # the text so far
    status: str  # a LiveStatus


class Step(TypedDict):
    """One model call, tool run, retry wait or skipped call. Times are epoch seconds."""

    turn_id: str
    index: int  # 1-based, per turn
    kind: str  # a Kind
    name: str
    started_at: float
    ended_at: float
    timeout_s: float | None  # the timeout it was given
    remaining_s: float | None  # the budget left when it started
    kept_s: NotRequired[float]  # tool runs: seconds of that budget kept back for the turn's last model call
    outcome: str  # an Outcome
    duration_s: float
    attempt: NotRequired[int]  # model calls: 1 for the first try
    last_call: NotRequired[bool]  # model calls: the last one, sent without tools
    tool_calls: NotRequired[int]  # model calls: how many tools the reply asked for
    turns_not_sent: NotRequired[int]  # model calls: earliest turns left out of what was sent (the history cap)
    detail: NotRequired[str]  # why it failed, was skipped or waited
    unstreamed: NotRequired[str]  # model calls asked without streaming (a stream came empty before): why
    arguments: NotRequired[str]  # tool runs: the call's arguments (cut)
    result: NotRequired[str]  # tool runs: the result the model got (cut)
    call_id: NotRequired[str]  # tool runs: the id of the model's call it answers
    refused_calls: NotRequired[int]  # the record of a refusal: how many calls it answers for
    not_run_calls: NotRequired[int]  # the record of calls left unrun (deadline, or time kept for the answer)
    usage: NotRequired[Usage]  # model calls: the tokens the provider reported
    # model calls (the fourth clock): the bound on its input tokens, the max_tokens it asked for (absent: none),
    # what it was charged in tokens and US dollars, and whether that is its worst case (not reported, failed, cut)
    input_bound: NotRequired[int]
    max_tokens: NotRequired[int]
    cost_tokens: NotRequired[int]
    cost_usd: NotRequired[float | None]
    cost_worst: NotRequired[bool]
    partial_text: NotRequired[str]  # model calls cut, failed or stopped mid-stream: the text that arrived (cut)
    partial_chars: NotRequired[int]  # ... and how many characters had arrived
    # approvals (kind approval: from the request to its answer): the clocks of the job that parked the turn,
    # so the wait is drawn between them and the next job's; and who answered
    deadline_at: NotRequired[float | None]
    job_timeout_at: NotRequired[float | None]
    answered_by: NotRequired[str]


class Approval(TypedDict):
    """A request for a person's approval of one tool call (the state's `approval`): pending while
    `answer` is None, then how and when it was answered. Times are epoch seconds."""

    id: str  # the request's id: an answer names it, so it is taken once
    call_id: str  # the model's tool call it is about
    name: str  # the tool, as the model sees it
    arguments: str  # the call's arguments as the tool receives them: decoded JSON written again, whole, with every
    # character a reader would not see escaped (agent/turn/approvals.py shown_arguments; shown inert)
    asked_at: float
    expires_at: float
    answer: str | None  # None while pending; then an Outcome in ANSWERS
    answered_at: float | None
    answered_by: str | None  # who answered, in words ("on the page", "from the command line", ...)
    job_id: str | None  # the job that continues the turn after the answer
    steps_before: int  # steps the turn had recorded when it parked: the answer's step is the next


class Branch(TypedDict):
    """What started a turn beside another (a TurnDoc's and a summary's `branch`; None for a plain message)."""

    of: str  # the turn it answers again (`regenerate`) or whose message it replaces (`edit`)
    kind: str  # "regenerate" or "edit"


class TurnSummary(TypedDict):
    """One ended turn (the state keeps one per turn, in `turns`); `ended_at` is None while in flight."""

    turn_id: str
    status: str
    error: Error | None
    enqueued_at: float | None
    started_at: float | None
    deadline_at: float | None
    job_timeout_at: float | None
    ended_at: float | None
    config: dict | None
    trace_parent: NotRequired[str | None]  # the W3C traceparent of the turn's trace (tracing on)
    spend: NotRequired[Spend | None]  # what the turn spent, against its budget
    branch: NotRequired[Branch | None]  # a regenerate or an edit: of which turn (None: a message)
    # where it is in the conversation's tree, as the state reads it (not stored in the summary itself)
    parent_turn_id: NotRequired[str | None]  # None: a first turn
    siblings: NotRequired[list[str]]  # the turns sharing its parent, itself included, oldest first


class TurnDoc(TypedDict, total=False):
    """The small fields a write replaces as a whole (the store adds `updated_at`)."""

    status: str
    error: Error | None
    config: dict | None
    job_id: str
    enqueued_at: float | None
    started_at: float | None
    deadline_at: float | None
    job_timeout_at: float | None
    current_step: CurrentStep | None
    ended_at: float
    updated_at: float
    trace_parent: str | None  # the W3C traceparent of the turn's trace, when tracing is on (agent/tracing.py)
    attempt: int  # 0; 1, 2, ... once the turn was resumed on another worker after its worker was lost
    approval: Approval | None  # the turn's latest request for approval, pending or answered
    spend: Spend | None  # the turn's spend so far (None until it first calls the model)
    branch: Branch | None  # a regenerate or an edit: of which turn (None: a message)


class State(TypedDict):
    """The object every client reads: the contract's fields, then what the page needs for the clocks."""

    conversation_id: str
    turn_id: str
    version: int  # +1 on every write
    done: bool  # false while a turn is in flight; true once it has ended, however it ended
    status: str
    error: Error | None
    history: list[Message]
    steps: list[Step]
    deadline_at: float | None
    job_timeout_at: float | None
    updated_at: float | None
    started_at: float | None
    enqueued_at: float | None
    current_step: CurrentStep | None
    config: dict | None
    job_id: str | None
    turns: list[TurnSummary]
    trace_parent: str | None
    attempt: int  # 0; 1, 2, ... once the turn was resumed on another worker after its worker was lost
    live: Live | None  # the text being written now; None between model calls and once the turn ends
    approval: Approval | None  # the turn's latest request for approval: pending while status is awaiting_approval
    owner: str | None  # the id of the signed-in person whose conversation it is; None in the local playground
    spend: Spend | None  # the turn's spend so far against its budget (the fourth clock)
    branch: NotRequired[Branch | None]  # the turn is a regenerate or an edit: of which turn (None: a message)
    # A conversation is a tree of turns, and the state its branch shown: `turn_id` is that branch's latest turn
    # (the one in flight, while one is); history, steps and turns are the path to it.
    parent_turn_id: NotRequired[str | None]  # turn_id's parent (None: a first turn)
    siblings: NotRequired[list[str]]  # the turns sharing that parent, turn_id's included, oldest first
    tree_version: NotRequired[int]  # +1 whenever a turn is added or another branch is shown (0: the flat shape)


# The small fields a turn carries from one write to the next (its job and the endings copy them).
CARRIED_FIELDS = ("status", "error", "deadline_at", "job_timeout_at", "started_at", "enqueued_at", "current_step",
                  "config", "job_id", "trace_parent", "attempt", "approval", "spend", "branch")
LIST_FIELDS = ("history", "steps", "turns")  # the append-only parts of the state


def queued_doc(config: dict, job_id: str, enqueued_at: float, trace_parent: str | None = None,
               branch: Branch | None = None) -> TurnDoc:
    """A turn's small fields when it is enqueued: nothing has run yet."""
    return TurnDoc(status=Status.QUEUED, error=None, config=config, job_id=job_id, enqueued_at=enqueued_at,
                   deadline_at=None, job_timeout_at=None, started_at=None, current_step=None,
                   trace_parent=trace_parent, attempt=0, approval=None, spend=None, branch=branch)


def carried(state: State | TurnDoc) -> TurnDoc:
    return TurnDoc(**{name: state.get(name) for name in CARRIED_FIELDS})


def make_step(turn_id: str, index: int, kind: str, name: str, started_at: float, ended_at: float, outcome: str,
              *, timeout_s: float | None = None, remaining_s: float | None = None, **extra: Any) -> Step:
    step = {"turn_id": turn_id, "index": index, "kind": kind, "name": name, "started_at": started_at,
            "ended_at": ended_at, "timeout_s": timeout_s, "remaining_s": remaining_s, "outcome": outcome, **extra}
    step["duration_s"] = round(ended_at - started_at, 3)
    return step


def turn_summary(turn_id: str, doc: TurnDoc | State, ended_at: float | None) -> TurnSummary:
    return TurnSummary(turn_id=turn_id, status=doc.get("status"), error=doc.get("error"),
                       enqueued_at=doc.get("enqueued_at"), started_at=doc.get("started_at"),
                       deadline_at=doc.get("deadline_at"), job_timeout_at=doc.get("job_timeout_at"),
                       ended_at=ended_at, config=doc.get("config"), trace_parent=doc.get("trace_parent"),
                       spend=doc.get("spend"), branch=doc.get("branch"))


def live_summary(state: State) -> TurnSummary:
    """The turn in flight has no summary until it ends: its fields come from the state itself."""
    return turn_summary(state.get("turn_id"), state, None)


def make_state(conversation_id: str, turn_id: str | None, version: int, done: bool, doc: TurnDoc,
               history: list[Message], steps: list[Step], turns: list[TurnSummary], live: Live | None = None) -> State:
    return State(
        conversation_id=conversation_id,
        turn_id=turn_id,
        version=version,
        done=done,
        status=doc.get("status", Status.QUEUED),
        error=doc.get("error"),
        history=history,
        steps=steps,
        deadline_at=doc.get("deadline_at"),
        job_timeout_at=doc.get("job_timeout_at"),
        updated_at=doc.get("updated_at"),
        # Beyond the contract's fields: what the page needs to draw the clocks.
        started_at=doc.get("started_at"),
        enqueued_at=doc.get("enqueued_at"),
        current_step=doc.get("current_step"),
        config=doc.get("config"),
        job_id=doc.get("job_id"),
        turns=turns,
        trace_parent=doc.get("trace_parent"),
        attempt=doc.get("attempt") or 0,
        live=live,
        approval=doc.get("approval"),
        spend=doc.get("spend"),
        branch=doc.get("branch"),
    )


def safeguards_on(config: dict | None) -> bool:
    """A turn's config says whether its safeguards were on (they are unless it says False)."""
    return (config or {}).get("safeguards") is not False
