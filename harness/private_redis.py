"""A Redis server of one's own (the embedded binary, in a directory of its own) with the product's
clients on it, so that stopping, pausing or flushing it touches nobody else."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import redis

from agent.conversation.store import Store
from agent.queue import get_queue
from agent.runtime.connection import queue_client, state_client
from agent.runtime.embedded_redis import EmbeddedRedis
from agent.settings import redis_maxmemory_mb

DEFAULT_STATE_TTL_S = 600  # seconds; long enough for any test (the product keeps conversations 30 days)


class PrivateRedis:
    """The server, its URL, a state client and store, and a queue on its own queue connection."""

    def __init__(self, directory: Path, *, state_ttl_s: float = DEFAULT_STATE_TTL_S):
        self.server = EmbeddedRedis(directory, maxmemory_mb=redis_maxmemory_mb())
        self.url = self.server.acquire()
        self.client = state_client(self.url)
        self.store = Store(self.client, ttl_s=state_ttl_s)
        self.queue_connection = queue_client(self.url)  # RQ's own client (its socket timeouts are RQ's)
        self.queue = get_queue(self.queue_connection)

    @property
    def pid(self) -> int | None:
        return self.server.pid

    def resume(self) -> None:
        """Wake the server if a test froze it with SIGSTOP (a no-op otherwise)."""
        pid = self.server.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        """Close the clients and stop the server (also one left frozen by SIGSTOP)."""
        self.resume()  # a frozen server must be able to stop
        with contextlib.suppress(Exception):
            self.client.close()
            self.queue_connection.close()
        self.server.stop()

    def __enter__(self) -> PrivateRedis:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def stored_values(client: redis.Redis) -> Iterator[tuple[bytes, list[bytes]]]:
    """Every key with every value stored under it (a hash's or a stream's fields too), for leak checks."""
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            values = [client.get(key) or b""]
        elif kind == b"list":
            values = client.lrange(key, 0, -1)
        elif kind == b"hash":
            values = [part for pair in client.hgetall(key).items() for part in pair]
        elif kind == b"set":
            values = list(client.smembers(key))
        elif kind == b"zset":
            values = client.zrange(key, 0, -1)
        elif kind == b"stream":
            values = [part for _, fields in client.xrange(key) for pair in fields.items() for part in pair]
        else:
            values = []
        yield key, values
