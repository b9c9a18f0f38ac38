"""The queue: enqueue a turn (ids only), job status, the cooperative stop, and the one job
function a worker will run.

Even with the JSON serializer a job names a dotted path that the worker imports and calls,
so anyone who can write to Redis could run code. SafeJob refuses every name but ours. And nothing
here unpickles: importing this module makes RQ's default serializer JSON (agent/runtime/json_only.py).
"""

from __future__ import annotations

import contextlib
import copy
import re
import time
import uuid
from dataclasses import replace

import redis
from rq import Queue
from rq.callbacks import Callback
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.rate_limit import RateLimit
from rq.serializers import JSONSerializer

from agent import tracing
from agent.contract import Branch, Role, queued_doc
from agent.conversation import daily
from agent.conversation.endings import Ending, write_ending
from agent.conversation.store import Store
from agent.conversation.workers import live_workers
from agent.prices import pusd_to_usd, usd_to_pusd
from agent.runtime import json_only
from agent.runtime.connection import redis_problem
from agent.settings import MIN_BUDGET_TOKENS, TurnConfig
from agent.spend import turn_price

json_only.install()  # before any queue, job or worker of this process loads a job

QUEUE_NAME = "agent-turns"
JOB_FUNCTION = "agent.turn.run_turn"
FAILURE_CALLBACK = "agent.turn.on_failure"
ALLOWED_FUNCTIONS = frozenset({JOB_FUNCTION})
ALLOWED_CALLBACKS = frozenset({FAILURE_CALLBACK})
FAILURE_CALLBACK_TIMEOUT_S = 10  # seconds
RESULT_TTL_S = 600  # seconds a finished job's record is kept
QUEUE_WAIT_S = 3600  # seconds a turn may wait for a worker (the state TTL, if shorter); then RQ drops it
KILL_MARGIN_S = 60  # seconds past its job timeout after which RQ's parent worker kills a work horse
MAX_MESSAGE_CHARS = 8000  # longest user message accepted


class UnsafeJobError(Exception):
    """A job named a function this project does not run."""


SHARE_KEY_PREFIX = "agent-person-"
SHARE_KEY_RE = re.compile(re.escape(SHARE_KEY_PREFIX) + r"p[0-9a-f]{20}")  # share_key's, and nothing else
MAX_SHARE = 256  # the most of one person's turns queued or running at once that a loaded job may ask for
NEUTRAL_JOB_FIELDS = {  # what a loaded job holds, whatever its payload asked for
    "webhooks": [],
    "retries_left": None,
    "retry_intervals": None,
    "enqueue_at_front_on_retry": False,
    "repeats_left": None,
    "repeat_intervals": None,
    "_dependency_ids": [],
    "allow_dependency_failures": None,
    "_success_callback_name": None,
    "_stopped_callback_name": None,
    "_success_callback_timeout": None,
    "_stopped_callback_timeout": None,
}


class SafeJob(Job):
    """A job as this project writes it, whatever else its payload in Redis says.

    Our jobs use no webhooks, retries, repeats, dependencies, success or stopped callbacks; one failure
    callback with its own timeout; and no rate limit but a person's share (share_key). A forged payload
    can ask for each of them, and each makes a worker connect somewhere (a webhook carries the traceback,
    with the payload's headers, to any URL), wait (a webhook's timeout against a silent listener), or run
    again (retries, repeats): all are dropped when a job is loaded, before a worker acts on it."""

    def restore(self, raw_data) -> None:
        super().restore(raw_data)
        for name, value in NEUTRAL_JOB_FIELDS.items():
            setattr(self, name, copy.copy(value))
        if self._failure_callback_name != FAILURE_CALLBACK:
            self._failure_callback_name = None
        if not (SHARE_KEY_RE.fullmatch(self.rate_limit_key or "")
                and 1 <= (self.rate_limit_concurrency or 0) <= MAX_SHARE):
            self.rate_limit_key, self.rate_limit_concurrency = None, None
        self._failure_callback_timeout = FAILURE_CALLBACK_TIMEOUT_S

    def send_webhooks(self, status, *, exc_string=None) -> None:
        """Never: our jobs have none, and a forged one's would send its traceback anywhere."""

    @property
    def func(self):
        if self.func_name not in ALLOWED_FUNCTIONS:
            raise UnsafeJobError(f"refused to run {self.func_name!r}: only {JOB_FUNCTION} may run")
        return super().func

    @property
    def success_callback(self):
        return None

    @property
    def failure_callback(self):
        # Checked before the parent imports anything by that name.
        return super().failure_callback if self._failure_callback_name in ALLOWED_CALLBACKS else None

    @property
    def stopped_callback(self):
        return None


class SafeQueue(Queue):
    """A queue that loads its jobs as SafeJob, in JSON, whatever job class and serializer its caller
    passed: `rq info` builds its queues with neither (see dashboard.py), and cleaning a queue's
    registries runs the failure callback that an abandoned job names."""

    def __init__(self, *args, **kwargs):
        kwargs.update(job_class=SafeJob, serializer=JSONSerializer)
        super().__init__(*args, **kwargs)


def get_queue(connection: redis.Redis) -> Queue:
    return SafeQueue(QUEUE_NAME, connection=connection)


class BadMessage(ValueError):
    """The user's message cannot be sent as it is; the text says why."""


def clean_message(text: str | None) -> str:
    """Validate a user's message: not empty, not over the limit, no control characters."""
    if text is None:
        raise BadMessage("Type a message first.")
    text = "".join(ch for ch in text if ch in "\n\t" or (ord(ch) >= 32 and ord(ch) != 127))
    # Bytes that are not UTF-8 (a binary argv arrives as lone surrogates) cannot be stored: mark them.
    text = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
    text = text.strip()
    if not text:
        raise BadMessage("Type a message first: an empty message was not sent.")
    if len(text) > MAX_MESSAGE_CHARS:
        raise BadMessage(
            f"The message is {len(text):,} characters; the limit is {MAX_MESSAGE_CHARS:,}. Nothing was sent."
        )
    return text


def queue_wait_s(state_ttl_s: int) -> int:
    """How long a turn may wait in the queue before its job is dropped, unrun.

    Not the state's TTL, which now keeps a person's conversations for days: nobody waits days for a reply."""
    return QUEUE_WAIT_S


def queued_state_ttl_s(state_ttl_s: int, config: TurnConfig) -> int:
    """The TTL of a conversation whose turn is waiting: it must outlive everything its job can still do.

    A state TTL of AGENT_STATE_TTL alone dropped a turn that waited longer than that behind slow
    turns: its job started, found no conversation, and ended without a word. The job may start as
    late as queue_wait_s from now (RQ drops it then, and the front ends say so, see lost_worker.py); with
    safeguards off it writes nothing until it ends, up to its job timeout plus RQ's kill margin later.
    Once the job writes, every write sets the TTL back to AGENT_STATE_TTL."""
    return max(state_ttl_s, queue_wait_s(state_ttl_s) + config.job_timeout_s + KILL_MARGIN_S)


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def job_id_for(turn_id: str) -> str:
    return f"turn-{turn_id}"


def submit_turn(
    store: Store,
    queue: Queue,
    conversation_id: str,
    text: str,
    config: TurnConfig,
    *,
    turn_id: str | None = None,
    must_exist: bool = False,
    share: int = 0,
    daily_budget_usd: float | None = None,
    branch_of: str = "",
) -> str:
    """Append the user's message, mark the turn queued, and enqueue it. Returns the turn id.

    Raises BadMessage for bad input, TurnInFlight when a turn is still running, and (from the
    store) ConversationGone, ConversationFull, StoreFull or DailyBudgetSpent; in each case nothing is enqueued.
    `daily_budget_usd` (with sign-in): the turn's budget is reserved against the person's day first, and is at
    most what is left of it (agent/conversation/daily.py).
    The same turn id twice (a double submit) enqueues once. `must_exist`: the sender continues a
    conversation it has seen, so one that expired or was deleted meanwhile is not started afresh.
    `branch_of` (a regenerate or an edit of that turn): the new turn is its sibling (its parent is that turn's
    parent) and is shown; TurnInFlight as for any message, NoSuchTurn when the conversation has no such turn.
    """
    text = clean_message(text)
    share = share if store.person and share > 0 else 0
    config = replace(config, share=share)  # kept with the turn: its continuations count against it too
    turn_id = turn_id or new_id()
    job_id = job_id_for(turn_id)
    if daily_budget_usd is not None and store.person and turn_price(config) is not None:
        config = reserve_daily(store, config, daily_budget_usd)
    return _submit(store, queue, conversation_id, text, config, turn_id, job_id, must_exist or bool(branch_of), share,
                   branch_of)


def reserve_daily(store: Store, config: TurnConfig, daily_budget_usd: float) -> TurnConfig:
    """The turn's dollar budget, reserved against its person's day: the turn's own budget, or what is left of
    the day when that is less (or the turn has none); DailyBudgetSpent when less is left than a turn needs."""
    price = turn_price(config)
    want = usd_to_pusd(config.budget_usd) if config.budget_usd is not None else 0
    least = MIN_BUDGET_TOKENS * max(price.input_pusd, price.output_pusd)  # what the smallest token budget costs
    granted = daily.reserve(store.redis, store.person, daily_pusd=usd_to_pusd(daily_budget_usd), want_pusd=want,
                            least_pusd=least, now=time.time())
    return replace(config, budget_usd=pusd_to_usd(granted["pusd"]), daily=granted)


def _submit(store: Store, queue: Queue, conversation_id: str, text: str, config: TurnConfig, turn_id: str,
            job_id: str, must_exist: bool, share: int, branch_of: str = "") -> str:
    branch = None
    if branch_of:  # the same message again: a regenerate; another: an edit
        of = store.turn_message(conversation_id, branch_of)
        branch = Branch(of=branch_of, kind="regenerate" if of and of.get("content") == text else "edit")
    doc = queued_doc(config.to_dict(), job_id, time.time(), tracing.submit_span(conversation_id, turn_id,
                                                                                  config.to_dict()), branch)
    try:
        new, _ = store.begin_turn(conversation_id, turn_id, {"role": Role.USER, "content": text}, doc,
                                  ttl_s=queued_state_ttl_s(store.ttl_s, config), must_exist=must_exist,
                                  branch_of=branch_of)
    except BaseException:
        if config.daily:  # refused, never sent: its reservation goes back to the person's day
            daily.release(store.redis, config.daily, turn_id)
        raise
    if not new and config.daily:  # a double submit: the turn has the reservation of the first
        daily.release(store.redis, config.daily, turn_id)
    # A retry of a submit that reached the state but not the queue enqueues what is missing; a job
    # enqueued twice is harmless: only the first to claim the turn runs it.
    if new or not SafeJob.exists(job_id, connection=queue.connection):
        try:
            enqueue_turn(queue, conversation_id, turn_id, job_id, job_timeout_s=config.job_timeout_s,
                         wait_s=queue_wait_s(store.ttl_s),
                         rate_limit=RateLimit(share_key(store.person), share) if share else None)
        except redis.RedisError as exc:
            not_queued(store, conversation_id, turn_id, exc)
            raise
    return turn_id


def not_queued(store: Store, conversation_id: str, turn_id: str, exc: redis.RedisError) -> None:
    """The turn was accepted but its job was refused (Redis full, or gone meanwhile): end it with the reason,
    so that it does not wait for a job that does not exist. The ending lands even at Redis's maxmemory (it
    releases the turn's reservation first, room.py); with Redis gone, the front ends' check ends it later."""
    with contextlib.suppress(redis.RedisError):
        write_ending(store, conversation_id, turn_id, Ending.not_queued(redis_problem(exc)))


def share_key(person_id: str) -> str:
    """The RateLimit key of a signed-in person's turns."""
    return f"{SHARE_KEY_PREFIX}{person_id}"


def enqueue_turn(queue: Queue, conversation_id: str, turn_id: str, job_id: str, *, job_timeout_s: int, wait_s: int,
                 at_front: bool = False, rate_limit: RateLimit | None = None) -> None:
    """Enqueue the job that runs a turn (ids only, never who asked): its first run or its continuation after an
    answer (`rate_limit`: a person's share of the workers; approvals.py), or its resume (agent/turn/resume.py: at
    the front)."""
    queue.enqueue(
        JOB_FUNCTION,
        conversation_id,
        turn_id,
        job_id=job_id,
        job_timeout=job_timeout_s,
        result_ttl=RESULT_TTL_S,
        failure_ttl=RESULT_TTL_S,
        ttl=wait_s,
        on_failure=Callback(FAILURE_CALLBACK, timeout=FAILURE_CALLBACK_TIMEOUT_S),
        description=f"agent turn {turn_id}",
        at_front=at_front,
        **({"rate_limit": rate_limit} if rate_limit is not None else {}),
    )


def cancel_held(connection: redis.Redis, job_id: str) -> None:
    """Cancel a job held outside the queue by its person's share (RQ status `rate_limited`), so that it never
    runs and holds no place; a job that has moved on meanwhile is left as it is (its turn has ended: a worker
    that takes it finds nothing to do)."""
    try:
        job = SafeJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
        if getattr(job.get_status(refresh=False), "value", None) == "rate_limited":
            job.cancel()
    except (NoSuchJobError, InvalidJobOperation, ValueError):  # gone, or already cancelled: nothing held
        pass


def job_status(connection: redis.Redis, job_id: str) -> str | None:
    """RQ's status for a job ('queued', 'started', 'finished', 'failed', 'stopped', ...) or None if gone."""
    try:
        job = SafeJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
    except (NoSuchJobError, ValueError):  # ValueError: an id RQ refuses (a hand-written state) names no job
        return None
    status = job.get_status(refresh=False)
    return status.value if hasattr(status, "value") else status


def queue_position(queue: Queue, job_id: str) -> int | None:
    """1-based place of a waiting job, or None when it is not waiting."""
    position = queue.get_job_position(job_id)
    return None if position is None else position + 1


def running_workers(queue: Queue) -> int:
    """How many workers are there now: those that beat (agent/conversation/workers.py), not RQ's
    registrations, which a killed worker leaves behind for minutes."""
    return live_workers(queue.connection)[0]


def worker_counts(queue: Queue) -> tuple[int, int]:
    """(workers there now, how many of them are busy with a turn)."""
    return live_workers(queue.connection)
