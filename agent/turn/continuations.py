"""The job that continues a turn after a person's answer to its request for approval (approvals.py): its id,
its enqueue, and its repair when it never reached the queue.

The continuation counts against its owner's fair share of the workers (a signed-in person's RateLimit,
kept with the turn as its config's `share`), behind the turns already waiting; a turn of nobody's (the
local playground, which has no share) goes to the front. The answer is recorded before the job is
enqueued (scripts/answer.lua enters the conversation in agent:approvals:continuing), so an enqueue that
fails (Redis full, or gone, between the two) leaves an answer that stands and a turn whose job never came:
the pool's watch (`requeue_stranded`, in the look that expires requests) and a front end's check
(`requeue_if_stranded`) enqueue it again, once however many of them find it.
"""

from __future__ import annotations

import logging
import time

import redis
from rq import Queue
from rq.rate_limit import RateLimit

from agent.contract import State, Status
from agent.conversation.store import Store
from agent.queue import MAX_SHARE, SafeJob, enqueue_turn, job_id_for, queue_wait_s, share_key
from agent.runtime.connection import redis_problem
from agent.settings import TurnConfig

log = logging.getLogger(__name__)

GRACE_S = 5.0  # seconds after an answer before the watch looks for its continuation on the queue
MARK = "-approval-"  # in the id of the job that continues a turn after an answer


def continuation_id(turn_id: str, request_id: str) -> str:
    """The job that continues a turn after the answer to its request `request_id`."""
    return f"{job_id_for(turn_id)}{MARK}{request_id}"


def enqueue(store: Store, queue: Queue, conversation_id: str, state: State, job_id: str,
            config: TurnConfig) -> bool:
    """Enqueue the job that continues an answered turn, counted against its owner's fair share of the workers
    (a signed-in person's: see submit_turn), behind the turns already waiting; at the front when the turn is
    nobody's (the local playground, which has no share). False when Redis refused it (logged)."""
    person = state.get("owner")
    share = min(MAX_SHARE, config.share) if person and config.share > 0 else 0
    try:
        enqueue_turn(queue, conversation_id, state["turn_id"], job_id, job_timeout_s=config.job_timeout_s,
                     wait_s=queue_wait_s(store.ttl_s), at_front=not share,
                     rate_limit=RateLimit(share_key(person), share) if share else None)
    except redis.RedisError as exc:
        log.warning("turn %s: its answer is recorded, but its continuation was not queued (%s); the pool's watch "
                    "queues it", state["turn_id"], redis_problem(exc))
        return False
    return True


def requeue_stranded(store: Store, queue: Queue, limit: int, now: float | None = None) -> int:
    """Enqueue again each continuation an answer recorded but the queue never got (Redis refused it, or went
    away, between the two); forget those seen on the queue, or whose turn moved on. Returns how many were
    enqueued again."""
    now = time.time() if now is None else now
    requeued = 0
    for conversation_id in store.flags.continuations_due(now, limit):
        state = store.read_meta(conversation_id)
        if not stranded(state) or SafeJob.exists(state["job_id"], connection=queue.connection):
            store.flags.continued(conversation_id)
            continue
        store.flags.look_again(conversation_id, now + GRACE_S)
        requeued += _requeue(store, queue, state)
    return requeued


def stranded(state: State | None) -> bool:
    """An answered turn still waiting for the continuation its answer named (whether that job exists is the
    queue's to say)."""
    approval = (state or {}).get("approval") or {}
    return bool(state and not state["done"] and state["status"] == Status.QUEUED and not state["started_at"]
                and approval.get("answer") and state["job_id"] and approval.get("job_id") == state["job_id"]
                and MARK in state["job_id"])


def requeue_if_stranded(store: Store, queue: Queue, state: State | None, now: float | None = None) -> bool:
    """A front end's look at one turn: True when it is answered and its continuation is not on the queue: not
    lost (the answer stands), and enqueued again once the answerer has had GRACE_S to do it."""
    now = time.time() if now is None else now
    if (not stranded(state) or SafeJob.exists(state["job_id"], connection=queue.connection)
            or now - (state["enqueued_at"] or now) >= queue_wait_s(store.ttl_s)):  # waited its longest: not kept
        return False
    if now - (state["enqueued_at"] or now) >= GRACE_S:
        _requeue(store, queue, state)
    return True


def _requeue(store: Store, queue: Queue, state: State) -> bool:
    """Enqueue a stranded continuation again, once however many watches and front ends find it."""
    if not store.flags.requeue_once(state["job_id"], GRACE_S):
        return False
    config = TurnConfig.from_dict(state["config"] or {})
    if not enqueue(store, queue, state["conversation_id"], state, state["job_id"], config):
        return False
    log.info("turn %s: its continuation never reached the queue; queued it now", state["turn_id"])
    return True
