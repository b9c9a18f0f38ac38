"""Never stuck: a front end's check for a turn whose worker was lost.

A SIGKILLed worker runs no failure callback, and RQ sweeps an abandoned job only much later,
so a client that sees `done: false` also looks at the job itself: gone, failed or stopped, or
no write past `job_timeout_at` plus a grace, means nobody will write the ending. The client
then writes it, so every tab sees it.
"""

from __future__ import annotations

import time

import redis
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

from agent.contract import Outcome, State, Status
from agent.conversation.endings import Ending, write_ending
from agent.conversation.store import Store
from agent.deadline import LOST_GRACE_S  # seconds past the job timeout before a silent turn counts as lost
from agent.queue import SafeJob, get_queue, queue_wait_s
from agent.settings import TurnConfig
from agent.turn import approvals, continuations
from agent.turn.resume import began, resume_or_end
from agent.turn.shutdown import stopped_with_the_app

CALLBACK_GRACE_S = 2.0  # seconds a failed job's own callback gets to write its ending first
LIMBO_GRACE_S = 3.0  # seconds a job may be off the queue yet not started (a worker is between the two)


def lost_reason(
    store: Store, queue_connection: redis.Redis, conversation_id: str, now: float | None = None
) -> str | None:
    """Why the in-flight turn can no longer end by itself, or None while it still can."""
    return _lost_reason(store, queue_connection, store.read_meta(conversation_id), now)


def _lost_reason(store: Store, queue_connection: redis.Redis, meta: State | None, now: float | None) -> str | None:
    now = time.time() if now is None else now
    if meta is None or meta["done"] or not meta["job_id"] or meta["status"] == Status.AWAITING_APPROVAL:
        return None  # a parked turn has no job: it waits for a person, then its request expires (approvals.py)
    try:
        job = SafeJob.fetch(meta["job_id"], connection=queue_connection, serializer=JSONSerializer)
    except (NoSuchJobError, ValueError):  # ValueError: an id RQ refuses (a hand-written state) names no job
        if _waited_too_long(store, meta, now):
            return f"it waited {_duration(now - meta['enqueued_at'])} for a free worker, the longest a message may wait"
        # A just-submitted turn writes its state before its job: give it a moment.
        if now - (meta["enqueued_at"] or now) > CALLBACK_GRACE_S:
            return "its job is gone from the queue"
        return None
    status = job.get_status(refresh=False)
    status = getattr(status, "value", status)
    if status == "queued" and _in_limbo(store, queue_connection, job.id, now):
        # A worker took it off the queue and died before marking it started: RQ would sweep it
        # out of its intermediate queue only at its next maintenance, minutes later.
        return "its job was taken off the queue by a worker that never started it"
    ended_at = job.ended_at.timestamp() if job.ended_at else None
    if status in ("failed", "stopped", "canceled") and (ended_at is None or now - ended_at > CALLBACK_GRACE_S):
        return f"its job was marked {status} without writing an ending"
    if status == "finished" and (ended_at is None or now - ended_at > CALLBACK_GRACE_S):
        # The job returned, yet the state is still in flight: its final write never reached Redis
        # (Redis away, or refusing writes, until the job gave up). Nobody else will write it.
        return "its job ended, but its last write did not reach Redis"
    if (status == "started" and not began(meta) and job.started_at
            and now - job.started_at.timestamp() > LIMBO_GRACE_S and not store.flags.alive([meta["turn_id"]])[0]):
        # Started by RQ, yet it never claimed the turn (the claim sets its heartbeat mark, claim.lua): its worker
        # was lost between the two. It has no clocks of its own to wait for: it is queued again.
        return "its job was started by a worker that was lost before it began the turn"
    job_timeout_at = meta["job_timeout_at"]
    if not job_timeout_at and status == "started" and job.started_at and job.timeout:
        # Killed before its first write: RQ's own start time and timeout say when it had to end.
        job_timeout_at = job.started_at.timestamp() + float(job.timeout)
    if job_timeout_at and now > job_timeout_at + LOST_GRACE_S:
        return f"no word from it for {now - job_timeout_at:.0f} s past the job timeout"
    return None


def _waited_too_long(store: Store, meta: State, now: float) -> bool:
    """True when a turn that never started was dropped by RQ for waiting longer than queue_wait_s."""
    enqueued_at = meta["enqueued_at"]
    return meta["status"] == Status.QUEUED and not meta["started_at"] and bool(enqueued_at) and (
        now - enqueued_at >= queue_wait_s(store.ttl_s))


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _in_limbo(store: Store, queue_connection: redis.Redis, job_id: str, now: float) -> bool:
    """True once a queued job has been missing from the queue for LIMBO_GRACE_S (seen across polls)."""
    if get_queue(queue_connection).get_job_position(job_id) is not None:
        store.flags.on_queue(job_id)
        return False
    return now - store.flags.off_queue_since(job_id, now) > LIMBO_GRACE_S


def lost_worker_check(
    store: Store, queue_connection: redis.Redis, conversation_id: str, known: State | None = None
) -> bool:
    """Write the ending for a lost turn. True when this call wrote it.

    `known` is the state the caller read at the current version, which saves reading it again."""
    meta = known if known is not None else store.read_meta(conversation_id)
    now = time.time()  # one clock for the reason and the message, so they cannot disagree
    if _overdue_request(meta, now):  # the pool's watch expires it; with no pool running, the front end does
        approvals.answer(store, get_queue(queue_connection), conversation_id, Outcome.EXPIRED, approvals.BY_NOBODY,
                         request_id=meta["approval"]["id"], now=now)
        return False
    if continuations.requeue_if_stranded(store, get_queue(queue_connection), meta, now):
        return False  # answered, but its continuation never reached the queue: it is there now (not lost)
    reason = _lost_reason(store, queue_connection, meta, now)
    if reason is None:
        return False
    if _resumable(store, queue_connection, meta, now):
        # The pool's watch resumes it too, within seconds; whoever is first hands it over, once.
        resume_or_end(store, get_queue(queue_connection), conversation_id, meta, meta["job_id"], reason)
        return False
    ending = Ending.queue_expired(reason) if _waited_too_long(store, meta, now) else Ending.worker_lost(reason)
    if stopped_with_the_app(meta["job_id"]):  # handed over as the app stopped, and never taken up in time
        ending = Ending.app_stopped(f"no worker took it up again in time ({reason})")
    return write_ending(store, conversation_id, meta["turn_id"], ending, writer=meta["job_id"] or "")


def _overdue_request(meta: State | None, now: float) -> bool:
    """A parked turn whose request for approval expired a grace ago and is still pending."""
    approval = (meta or {}).get("approval") or {}
    return bool(meta and not meta["done"] and meta["status"] == Status.AWAITING_APPROVAL and approval
                and not approval.get("answer") and now > approval["expires_at"] + CALLBACK_GRACE_S)


def _resumable(store: Store, queue_connection: redis.Redis, meta: State, now: float) -> bool:
    """A turn with a resume left: one that began, with the time for one left; one whose job a worker took and
    lost before it began the turn (queued again, on the clocks it was sent with; a job that never reached the
    queue, or is gone from it, is not: its ending says so). Otherwise its ending says it was lost."""
    config = TurnConfig.from_dict(meta["config"] or {})
    if meta["attempt"] >= config.max_resumes:
        return False
    if began(meta):
        return meta["deadline_at"] - now >= config.min_call_s
    return now - (meta["enqueued_at"] or now) < queue_wait_s(store.ttl_s) and SafeJob.exists(
        meta["job_id"], connection=queue_connection)
