"""The pool's watch over the turns in flight: a turn whose worker was lost is resumed on another.

Every supervisor (the embedded pool, every `python worker.py`) runs one, so detection never depends
on a page being open. Once a second it asks the index of running turns, whose entries are leases scored
by when they lapse (renewed by each turn's heartbeat, agent/turn/heartbeat.py), for the lapsed ones:
one range read, on Redis's clock, whatever the number running; only those are read further (their owners
and marks, in two round trips). A turn whose heartbeat lapsed is lost when its job is not waiting for a
worker: started yet silent, failed, stopped, finished without its ending, or gone. Several supervisors
may notice the same loss: the store hands the turn over once (resume.py). A worker its supervisor sees
die is not left to the lease: its turn is handed over at once (deaths.py).

The same look expires the requests for approval whose time is up (agent/turn/approvals.py), from the
index of parked turns scored by expiry: one range read when none is due. Every STRANDED_EVERY_S it also
reads STRANDED_BATCH of the accepted turns (the index of their memory reservations, agent/conversation/room.py),
going on from where its last look stopped and round again, their jobs' records and their heartbeat marks, in
four round trips: a turn whose job is gone (refused by a full Redis, or never enqueued by a sender that died) is
ended with the reason by the front ends' own check (lost_worker.py), so that no accepted turn waits for ever when
no page is open; one whose job RQ started but that never claimed it (a claimed turn beats) is queued again by that
check. And each look reads RQ's intermediate queue, where a job taken off the queue waits the few milliseconds
until it starts: one left there LIMBO_GRACE_S was taken by a worker that is gone, and its turn is handed over
(resume.py: once; queued again on the clocks it was sent with when it never began, resumed inside its own when
that job was its resume). The look at accepted turns costs the same however many are accepted; the time to come
round to every one of them does not (STRANDED_EVERY_S per STRANDED_BATCH: 100 s at 1,000 accepted), which suits a
loss this rare.

A heartbeat's TTL runs on Redis's clock. A Redis that stalls (SIGSTOP, a slow fork, a busy script) expires
nothing meanwhile, but when it resumes every mark whose TTL passed expires at once, before the workers'
renewals, queued behind the stall like everyone's commands, can land: each looks lapsed for a moment.
So the watch times its own looks: when two good looks are more than REDIS_AWAY_S apart (its reads failed
or stalled, or it was itself held up), Redis was away for longer than a heartbeat can bridge, and a lapsed
mark is not taken for a lost worker until the workers have had a whole HEARTBEAT_TTL_S of Redis back to
renew theirs. The hand-over itself (scripts/resume.lua) is refused while the lost job's mark is there.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

from agent.conversation.store import Store
from agent.hosting.deaths import hand_over_taken_job, worker_died
from agent.hosting.lost_worker import LIMBO_GRACE_S, lost_worker_check
from agent.queue import SafeJob, get_queue
from agent.runtime.connection import redis_problem
from agent.turn.approvals import expire_due
from agent.turn.heartbeat import HEARTBEAT_S, HEARTBEAT_TTL_S
from agent.turn.resume import resume_or_end

log = logging.getLogger(__name__)

WATCH_S = 1.0  # seconds between looks at the running turns
MAX_WATCHED = 1000  # lapsed turns looked at per look, the longest lapsed first (the rest at the next look)
# Seconds between two good looks past which Redis (or this watch) counts as having been away: a heartbeat
# renewed every HEARTBEAT_S lapses only when its worker could not reach Redis for about this long.
REDIS_AWAY_S = HEARTBEAT_TTL_S - HEARTBEAT_S
STRANDED_EVERY_S = 5.0  # seconds between two looks for accepted turns whose job is gone
STRANDED_BATCH = 50  # accepted turns read per such look, on from the last one read (then round again)


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
        self.last_look: float | None = None  # time.monotonic() at the end of the last look that reached Redis
        self.trust_lapses_from = 0.0  # time.monotonic() from which a lapsed heartbeat means a lost worker
        self.held_off = 0  # looks at which lapsed heartbeats were let be, Redis having been away
        self.stranded = 0  # accepted turns whose job was gone, ended by this watch
        self.next_stranded_look = 0.0  # time.monotonic() of the next look for them
        self.stranded_after: float | None = None  # the score of the last accepted turn read (None: from the first)
        self.limbo_since: dict[str, float] = {}  # job id -> time.monotonic() it was first seen taken, not started
        self.requeued = 0  # turns whose job a lost worker took and never began, queued again by this watch

    def sweep(self) -> None:
        try:
            self._sweep()
        except redis.RedisError:
            self.last_look = None  # Redis did not answer: the next good look starts a grace
            raise

    def redis_was_away(self, now: float) -> bool:
        """A good look ends at `now`: True while lapsed heartbeats are to be let be, because Redis (or this
        watch) was away until a moment ago and the workers have not yet had HEARTBEAT_TTL_S to renew."""
        if self.last_look is None or now - self.last_look > REDIS_AWAY_S:
            self.trust_lapses_from = now + HEARTBEAT_TTL_S
            if self.last_look is not None:
                log.info("turn watch: Redis did not answer for %.1f s; heartbeats get %g s to be renewed before a "
                         "lapsed one counts", now - self.last_look, HEARTBEAT_TTL_S)
        self.last_look = now
        return now < self.trust_lapses_from

    def look_for_lost_jobs(self, trusted: bool) -> None:
        """The jobs no heartbeat speaks for: taken off the queue and never started (each look), and (every
        STRANDED_EVERY_S) accepted turns whose job is gone or never claimed them. `trusted`: False while Redis was
        away a moment ago (no worker could move meanwhile), when no job is taken for lost on time alone."""
        self.requeue_limbo(time.monotonic(), trusted)
        if time.monotonic() >= self.next_stranded_look:
            self.next_stranded_look = time.monotonic() + STRANDED_EVERY_S
            self.end_stranded(trusted)

    def end_stranded(self, trusted: bool = True) -> None:
        """End the accepted turns whose job is gone (the front ends' check decides, and words it); forget the
        reservations of turns that ended, or whose conversation went, without releasing them."""
        flags = self.store.flags
        accepted = flags.accepted(STRANDED_BATCH, after=self.stranded_after)
        # A short read reached the end of the index: the next look starts from its first entry again.
        self.stranded_after = accepted[-1][2] if len(accepted) == STRANDED_BATCH else None
        accepted = [(conversation_id, turn_id, score) for conversation_id, turn_id, score in accepted if turn_id]
        if not accepted:
            return
        writers = flags.writers([conversation_id for conversation_id, _, _ in accepted])
        waiting = []
        for (conversation_id, turn_id, _), (current, done, writer, _) in zip(accepted, writers, strict=True):
            if current != turn_id or done != "0":
                flags.release_reservation(conversation_id, turn_id)
            elif writer:  # "" while parked on a request for approval: no job to look for
                waiting.append((conversation_id, turn_id, writer))
        if not waiting:
            return
        with self.queue_connection.pipeline(transaction=False) as pipe:
            for _, _, writer in waiting:
                pipe.hget(SafeJob.key_for(writer), "status")
            statuses = pipe.execute()
        beating = self.store.flags.alive([turn_id for _, turn_id, _ in waiting])
        for (conversation_id, _, _), status, alive in zip(waiting, statuses, beating, strict=True):
            if status is None:
                self.stranded += lost_worker_check(self.store, self.queue_connection, conversation_id)
            elif status == b"started" and not alive and trusted:
                # Started by RQ but never claimed (a claimed turn beats): a worker lost between the two, or one
                # that began it and was lost (the lease's look takes that one). The front ends' check decides.
                lost_worker_check(self.store, self.queue_connection, conversation_id)

    def requeue_limbo(self, now: float, trusted: bool) -> None:
        """Hand over the turns whose job a worker took off the queue and never started: RQ moves a job it takes
        to its intermediate queue and out of it as the job starts (a few milliseconds later), so one still there
        after LIMBO_GRACE_S was taken by a worker that was lost in between (RQ's own look at it comes minutes
        later, and fails it). One range read of a list that is nearly always empty. `trusted`: False while Redis
        was away a moment ago (no worker could move meanwhile), when nothing is handed over."""
        queue = get_queue(self.queue_connection)
        taken = [_text(job_id) for job_id in self.queue_connection.lrange(queue.intermediate_queue_key, 0,
                                                                           MAX_WATCHED - 1)]
        self.limbo_since = {job_id: self.limbo_since.get(job_id, now) for job_id in taken}
        if not trusted:
            return
        for job_id, since in self.limbo_since.items():
            if now - since > LIMBO_GRACE_S:
                self.requeued += hand_over_taken_job(self.store, self.queue_connection, job_id) == "resumed"

    def _sweep(self) -> None:
        self.expired += expire_due(self.store, get_queue(self.queue_connection))
        flags = self.store.flags
        lapsed = flags.lapsed(MAX_WATCHED)

        if not lapsed:
            away = self.redis_was_away(time.monotonic())
            self.look_for_lost_jobs(trusted=not away)
            return
        writers = flags.writers(lapsed)
        in_flight = []
        for conversation_id, (turn_id, done, writer, _) in zip(lapsed, writers, strict=True):
            if turn_id and done == "0":
                in_flight.append((conversation_id, turn_id, writer or ""))
            else:
                flags.not_running(conversation_id)  # ended (or gone) without its index entry removed
        now = time.time()
        beating = flags.alive([turn_id for _, turn_id, _ in in_flight])
        away = self.redis_was_away(time.monotonic())
        self.look_for_lost_jobs(trusted=not away)
        if away:
            self.held_off += not all(beating)
            return
        for (conversation_id, turn_id, writer), alive in zip(in_flight, beating, strict=True):
            if alive or not writer:
                continue
            reason = lost_job_reason(self.queue_connection, writer, now)
            state = self.store.read_meta(conversation_id) if reason else None
            if state is None or state["turn_id"] != turn_id or state["done"] or state["job_id"] != writer:
                continue
            outcome = resume_or_end(self.store, get_queue(self.queue_connection), conversation_id, state, writer,
                                    reason)
            self.resumed += outcome == "resumed"

    def worker_died(self, worker_name: str, returncode: int | None) -> str:
        """One of this supervisor's workers was seen to end: the turn it ran goes on at once (deaths.py)."""
        outcome = worker_died(self.store, self.queue_connection, worker_name, returncode)
        self.resumed += outcome == "resumed"
        return outcome

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


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
