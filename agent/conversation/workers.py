"""The workers that are there now: each worker process renews a short-lived mark, and the page and the
CLI count the marks, not RQ's registrations.

RQ keeps a worker's registration for minutes after the worker is gone (a SIGKILLed worker, or every
worker of a killed supervisor, stays registered until its key expires, up to its TTL of 420 s), so
`Worker.count` said "2 workers, 0 busy" while none was running. A worker that beats here every
WORKER_BEAT_S with a TTL of WORKER_ALIVE_S is counted; a worker killed, frozen or cut off from Redis
drops out within WORKER_ALIVE_S. The mark holds the worker's state (`idle`, `busy`, ...), so the busy
count is of live workers too.
"""

from __future__ import annotations

import redis

from agent.conversation.keys import WORKERS_KEY, worker_alive

WORKER_BEAT_S = 1.0  # seconds between renewals of a worker's mark
WORKER_ALIVE_S = 3.0  # seconds a mark lives: three missed renewals and the worker is not counted
_ALIVE_MS = int(WORKER_ALIVE_S * 1000)


def beat(client: redis.Redis, name: str, state: str) -> None:
    """This worker is there, in `state` (one pipeline: its mark and its name in the set of names). While
    Redis is full (it refuses SET and SADD), a mark that is there still has its TTL renewed (PEXPIRE adds
    nothing): a full Redis does not make the workers look gone."""
    with client.pipeline(transaction=False) as pipe:
        pipe.pexpire(worker_alive(name), _ALIVE_MS)
        pipe.set(worker_alive(name), state, px=_ALIVE_MS)
        pipe.sadd(WORKERS_KEY, name)
        renewed, *written = pipe.execute(raise_on_error=False)
    refused = next((result for result in written if isinstance(result, Exception)), None)
    if refused is not None and not (renewed is True or renewed == 1):
        raise refused


def gone(client: redis.Redis, name: str) -> None:
    """This worker stops: it is no longer counted (not waiting for its mark to lapse)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.delete(worker_alive(name))
        pipe.srem(WORKERS_KEY, name)
        pipe.execute()


def live_workers(client: redis.Redis) -> tuple[int, int]:
    """(workers there now, how many of them are busy); names whose mark lapsed leave the set."""
    names = [name.decode() if isinstance(name, bytes) else name for name in client.smembers(WORKERS_KEY)]
    if not names:
        return 0, 0
    states = client.mget([worker_alive(name) for name in names])
    lapsed = [name for name, state in zip(names, states, strict=True) if state is None]
    if lapsed:
        client.srem(WORKERS_KEY, *lapsed)  # a live worker that was missed puts itself back at its next beat
    live = [state for state in states if state is not None]
    return len(live), sum(state in (b"busy", "busy") for state in live)
