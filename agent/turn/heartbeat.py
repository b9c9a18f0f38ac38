"""A running turn's heartbeat: the sign that its worker is still there.

From the moment a job starts its turn until it leaves, a side thread renews a short-lived mark
(`agent:turn:{turn}:alive`) and the turn's lease in the index of running turns (scored by when it lapses,
on Redis's clock) every HEARTBEAT_S, in one script. A worker killed, out of memory, or paused (SIGSTOP, a
laptop lid) stops renewing them, and HEARTBEAT_TTL_S later the pool's supervisors find the lease lapsed
(agent/hosting/turn_watch.py: one range read, whatever the number running) and resume the turn on another
worker (resume.py). The cost is one script call a second per running turn.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from agent.conversation.store import Store
from agent.runtime.connection import redis_problem

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # seconds between renewals of the mark
HEARTBEAT_TTL_S = 3.0  # seconds the mark lives: three missed renewals and the worker counts as lost
ALIVE_MS = int(HEARTBEAT_TTL_S * 1000)


@contextmanager
def beating(store: Store, conversation_id: str, turn_id: str, job_id: str) -> Iterator[None]:
    """The turn is watched and its mark renewed while the block runs."""
    store.flags.start_running(conversation_id, turn_id, job_id, ALIVE_MS)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                store.flags.beat(conversation_id, turn_id, job_id, ALIVE_MS)
            except redis.RedisError as exc:  # Redis away: the turn's own writes say so; the next beat retries
                log.info("turn %s: heartbeat not renewed: %s", turn_id, redis_problem(exc))

    thread = threading.Thread(target=renew, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
