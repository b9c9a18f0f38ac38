"""A turn that the app's shutdown interrupts is handed over to the app's next start, not ended as if a
person had stopped it.

Stopping the app (Ctrl-C of `make run`, SIGTERM to the page's server or to `worker.py`) stops its
workers: a warm stop lets a running turn finish for a moment, then a cold stop raises SystemExit in it.
The job then writes what it has (the messages and steps so far) and hands the turn to a new job, the way
a lost worker's turn is resumed (scripts/resume.lua, exactly once), at the front of the queue. The next
worker to start (the app's next start, or any other worker on the same Redis) continues it inside its
own clocks, with a resume step that says the app was stopped. That job waits in the queue only while a
model call would still fit before the turn's deadline; past it, whoever looks next (the pool's watch,
a page, the CLI) ends the turn saying the app was stopped, and the same words end a turn that cannot be
handed over (no time or no resume left, Redis away).

The job that continues such a turn is named for it (`restart_job_id`), so that whoever ends it knows.
"""

from __future__ import annotations

import logging
import math
import time

import redis

from agent.conversation.store import Store
from agent.queue import enqueue_turn, get_queue, job_id_for, queue_wait_s
from agent.runtime.connection import redis_problem
from agent.settings import TurnConfig
from agent.turn.heartbeat import ALIVE_MS

log = logging.getLogger(__name__)

AFTER_STOP = "-after-stop-"  # in the id of a job that continues a turn its app's shutdown interrupted


def restart_job_id(turn_id: str, attempt: int) -> str:
    """The job that continues, on the app's next start, a turn its shutdown interrupted."""
    return f"{job_id_for(turn_id)}{AFTER_STOP}{attempt}"


def stopped_with_the_app(job_id: str | None) -> bool:
    """Whether this job continues a turn that the app's shutdown handed over."""
    return AFTER_STOP in (job_id or "")


def hand_over(store: Store, conversation_id: str, turn_id: str, writer: str) -> str | None:
    """Hand the turn, which job `writer` runs, to a job for the app's next start. None when it is handed over,
    or not this job's to hand over any more (ended, or taken, elsewhere); otherwise why it could not be, in
    words for the ending (Ending.app_stopped)."""
    try:
        state = store.read_meta(conversation_id)
        if state is None or state["turn_id"] != turn_id or state["done"] or state["job_id"] != writer:
            return None
        config = TurnConfig.from_dict(state["config"] or {})
        now = time.time()
        begun = bool(state["started_at"] and state["deadline_at"])  # else its next job starts it on fresh clocks
        remaining = (state["deadline_at"] or now) - now if begun else config.job_timeout_s - config.deadline_margin_s
        if begun and remaining < config.min_call_s:
            return (f"{max(0.0, remaining):.1f} s were left before its deadline, and a model call needs at least "
                    f"{config.min_call_s:g} s")
        new_writer = restart_job_id(turn_id, state["attempt"] + 1)
        outcome, attempt = store.resume(conversation_id, turn_id, writer, new_writer, max_resumes=config.max_resumes,
                                        alive_ms=ALIVE_MS, by_itself=True)
        if outcome == "spent":
            return (f"it had been resumed {attempt} time{'s' * (attempt != 1)} already, the most a turn may be "
                    "(AGENT_MAX_RESUMES)")
        if outcome != "ok":
            return None
        if begun:
            job_timeout_s, wait_s = math.floor(state["job_timeout_at"] - now), math.floor(remaining - config.min_call_s)
        else:
            job_timeout_s = config.job_timeout_s
            wait_s = math.floor(queue_wait_s(store.ttl_s) - (now - (state["enqueued_at"] or now)))
        enqueue_turn(get_queue(store.redis), conversation_id, turn_id, new_writer, job_timeout_s=max(1, job_timeout_s),
                     wait_s=max(1, wait_s), at_front=True)
    except redis.RedisError as exc:
        return f"Redis did not take the hand-over ({redis_problem(exc)})"
    log.warning("turn %s: the app is stopping; handed over to %s (attempt %d) for its next start, %.1f s before "
                "its deadline", turn_id, new_writer, attempt, remaining)
    return None
