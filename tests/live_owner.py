"""A live owner for a turn in flight that a test wrote by hand.

A turn written straight into the store as `queued` or `running` names a job that nobody runs. A front
end that looks at it (agent/hosting/lost_worker.py) finds that job gone after a grace of seconds and
ends or resumes the turn: on a busy machine a test's assertions come later than that, and see it ended
or resumed under them. `keep_alive` gives such a turn what a real one has, until the test ends
(tests/conftest.py stops it): its job's record (started, for a running turn, with its heartbeat renewed
as a worker renews it, agent/turn/heartbeat.py, so the pool's watch, agent/hosting/turn_watch.py, sees
it alive too), and for a queued turn the sighting of its job on the queue renewed (no worker of the
session's pool takes it: the job is on no queue's list).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import redis
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from agent.contract import Status
from agent.conversation.store import Store
from agent.queue import JOB_FUNCTION, SafeJob
from agent.turn.heartbeat import HEARTBEAT_S, beating

_running: list[contextlib.ExitStack] = []  # the owners started in this test, stopped at its end


@contextlib.contextmanager
def live_owner(store: Store, conversation_id: str) -> Iterator[None]:
    """The conversation's turn in flight has a live owner while the block runs."""
    pool = store.redis.connection_pool  # a client of its own: the test's may be closed before this stops
    client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class,
                                                              **pool.connection_kwargs))
    own = Store(client, ttl_s=store.ttl_s)
    meta = own.read_meta(conversation_id)
    assert meta is not None and not meta["done"], f"no turn in flight in {conversation_id}"
    job_id, turn_id = meta["job_id"], meta["turn_id"]
    job = SafeJob.create(JOB_FUNCTION, args=(conversation_id, turn_id), id=job_id, connection=client,
                         serializer=JSONSerializer)
    queued = meta["status"] == Status.QUEUED
    if not queued:
        job.started_at = datetime.now(UTC)
    job.save()
    job.set_status(JobStatus.QUEUED if queued else JobStatus.STARTED)
    try:
        if queued:
            with _renewed(lambda: own.flags.on_queue(job_id)):
                yield
        else:
            try:
                with beating(own, conversation_id, turn_id, job_id):
                    yield
            finally:
                own.flags.not_running(conversation_id)  # no watch looks at it once the test is done
    finally:
        client.close()


def keep_alive(store: Store, conversation_id: str) -> None:
    """A live owner for the conversation's turn in flight, until the test ends."""
    stack = contextlib.ExitStack()
    stack.enter_context(live_owner(store, conversation_id))
    _running.append(stack)


def stop_all() -> None:
    """End every owner this test started (tests/conftest.py, after each test)."""
    while _running:
        _running.pop().close()


@contextlib.contextmanager
def _renewed(renew) -> Iterator[None]:
    """`renew()` now and every HEARTBEAT_S while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while True:
            with contextlib.suppress(redis.RedisError):
                renew()
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=loop, name="live-owner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
