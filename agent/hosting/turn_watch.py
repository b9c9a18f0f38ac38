"""The pool's watch over the turns in flight: a turn whose worker was lost is resumed on another.

Every supervisor (the embedded pool, every `python worker.py`) runs one, so detection never depends
on a page being open. Once a second it reads the index of running turns (never a key scan) and, in
two round trips, their owners and heartbeats. A turn whose heartbeat lapsed is lost when its job is
not waiting for a worker: started yet silent, failed, stopped, finished without its ending, or gone.
Several supervisors may notice the same loss: the store hands the turn over once (resume.py).

The same look expires the requests for approval whose time is up (agent/turn/approvals.py), from the
index of parked turns scored by expiry: one range read when none is due.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

from agent.conversation.store import Store
from agent.queue import SafeJob, get_queue
from agent.runtime.connection import redis_problem
from agent.turn.approvals import expire_due
from agent.turn.heartbeat import HEARTBEAT_TTL_S
from agent.turn.resume import resume_or_end

log = logging.getLogger(__name__)

WATCH_S = 1.0  # seconds between looks at the running turns
MAX_WATCHED = 1000  # running turns looked at per look, the soonest job timeout first


def lost_job_reason(queue_connection: redis.Redis, job_id: str, now: float) -> str | None:
    """Why the job that owns a silent turn will not write again, or None while it may (still queued,
    or started a moment ago and about to beat)."""
    try:
        job = SafeJob.fetch(job_id, connection=queue_connection, serializer=JSONSerializer)
    except (NoSuchJobError, ValueError):
        return "its job is gone"
    status = job.get_status(refresh=False)
    status = getattr(status, "value", status)
    if status in ("queued", "deferred", "scheduled"):
        return None
    if status == "started":
        started_at = job.started_at.timestamp() if job.started_at else now
        return f"no heartbeat from it for {HEARTBEAT_TTL_S:g} s" if now - started_at > HEARTBEAT_TTL_S else None
    return f"its job was marked {status} without writing an ending"


class TurnWatch:
    """One supervisor's watch: `sweep` looks once; `start` looks every WATCH_S in a thread until `stop`."""

    def __init__(self, store: Store, queue_connection: redis.Redis):
        self.store = store
        self.queue_connection = queue_connection
        self.stopping = threading.Event()
        self.resumed = 0
        self.expired = 0  # requests for approval this watch expired

    def sweep(self) -> None:
        self.expired += expire_due(self.store, get_queue(self.queue_connection))
        flags = self.store.flags
        running = flags.running(MAX_WATCHED)
        if not running:
            return
        owners = flags.owners(running)
        in_flight = []
        for conversation_id, (turn_id, done, owner, _) in zip(running, owners, strict=True):
            if turn_id and done == "0":
                in_flight.append((conversation_id, turn_id, owner or ""))
            else:
                flags.not_running(conversation_id)  # ended (or gone) without its index entry removed
        now = time.time()
        beating = flags.alive([turn_id for _, turn_id, _ in in_flight])
        for (conversation_id, turn_id, owner), alive in zip(in_flight, beating, strict=True):
            if alive or not owner:
                continue
            reason = lost_job_reason(self.queue_connection, owner, now)
            state = self.store.read_meta(conversation_id) if reason else None
            if state is None or state["turn_id"] != turn_id or state["done"] or state["job_id"] != owner:
                continue
            outcome = resume_or_end(self.store, get_queue(self.queue_connection), conversation_id, state, owner,
                                    reason)
            self.resumed += outcome == "resumed"

    def start(self) -> TurnWatch:
        threading.Thread(target=self._run, name="turn-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        while not self.stopping.wait(WATCH_S):
            try:
                self.sweep()
            except redis.RedisError as exc:
                log.info("turn watch: Redis did not answer (%s); looking again in %g s", redis_problem(exc), WATCH_S)
            except Exception:  # noqa: BLE001 - the watch must outlive one bad state
                log.exception("turn watch: a look failed; looking again in %g s", WATCH_S)
