"""A worker seen to die: its turn is handed over at once, not after its heartbeat lapses.

The heartbeat (agent/turn/heartbeat.py) is for what no supervisor sees: a machine lost, a frozen process.
When a supervisor does see the process that ran a turn end (the pool sees a worker exit; a forking
worker sees its work horse killed), the job can write nothing more, so the turn goes on on another worker
through the same exactly-once hand-over (agent/turn/resume.py), on its own clocks, within a moment of the
death instead of the mark's 3 s TTL and the watch's next look.
"""

from __future__ import annotations

import logging

import redis
from rq import Worker
from rq.serializers import JSONSerializer

from agent.conversation.store import Store
from agent.queue import JOB_FUNCTION, SafeJob, get_queue
from agent.runtime.connection import redis_problem
from agent.turn.resume import resume_or_end

log = logging.getLogger(__name__)


def current_job_of(queue_connection: redis.Redis, worker_name: str) -> str | None:
    """The job RQ records a worker as running (its record outlives a killed worker for a while), or None."""
    worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + worker_name, connection=queue_connection,
                                serializer=JSONSerializer)
    return worker.get_current_job_id() if worker is not None else None


def hand_over_dead_job(store: Store, queue_connection: redis.Redis, job_id: str, reason: str) -> str:
    """The turn job `job_id` ran, whose process is known to have ended: resumed (or ended, saying why) now.
    Returns what resume_or_end says, or "not a turn in flight" when the job owns no turn in flight."""
    owned = _turn_owned_by(store, queue_connection, job_id)
    if owned is None:
        return "not a turn in flight"
    conversation_id, turn_id, state = owned
    outcome = resume_or_end(store, get_queue(queue_connection), conversation_id, state, job_id, reason,
                            known_dead=True)
    log.warning("turn %s: %s; %s at once", turn_id, reason, outcome)
    return outcome


def hand_over_taken_job(store: Store, queue_connection: redis.Redis, job_id: str) -> str:
    """The turn job `job_id` was taken off the queue for, by a worker that never started it (the watch found it
    left in RQ's intermediate queue), is handed over once (resume.py): a turn that never began is queued again on
    the clocks it was sent with; one that began (this job was its resume) is resumed again inside its own. Returns
    what resume_or_end says, or "not a turn in flight" when the job owns no turn in flight."""
    owned = _turn_owned_by(store, queue_connection, job_id)
    if owned is None or store.flags.alive([owned[1]])[0]:
        return "not a turn in flight"
    conversation_id, turn_id, state = owned
    outcome = resume_or_end(store, get_queue(queue_connection), conversation_id, state, job_id,
                            "its job was taken off the queue by a worker that was lost before it started it")
    log.warning("turn %s: its job %s was taken off the queue and never started; %s", turn_id, job_id, outcome)
    return outcome


def _turn_owned_by(store: Store, queue_connection: redis.Redis, job_id: str) -> tuple[str, str, dict] | None:
    """(conversation id, turn id, meta) of the turn in flight that turn job `job_id` owns, or None: the job is
    gone, not ours to read, not a turn job, or no longer its turn's writer."""
    try:
        job = SafeJob.fetch(job_id, connection=queue_connection, serializer=JSONSerializer)
    except Exception:  # noqa: BLE001 - gone, or not ours to read: nothing to hand over
        return None
    if job.func_name != JOB_FUNCTION or len(job.args) != 2:
        return None
    conversation_id, turn_id = job.args
    state = store.read_meta(conversation_id)
    if state is None or state["turn_id"] != turn_id or state["done"] or state["job_id"] != job_id:
        return None
    return conversation_id, turn_id, state


def worker_died(store: Store, queue_connection: redis.Redis, worker_name: str, returncode: int | None) -> str:
    """A worker process of this supervisor's ended (not to be recycled): hand over the turn it ran, if any."""
    how = f"killed by signal {-returncode}" if returncode is not None and returncode < 0 else f"exit {returncode}"
    try:
        job_id = current_job_of(queue_connection, worker_name)
        if job_id is None:
            return "idle"
        return hand_over_dead_job(store, queue_connection, job_id, f"it died: {how}")
    except redis.RedisError as exc:  # the watch's heartbeat look takes it from here
        log.info("worker %s died (%s); its turn is left to the watch: %s", worker_name, how, redis_problem(exc))
        return "left to the watch"
