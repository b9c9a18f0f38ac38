"""Room in Redis for new turns: past NEW_TURNS_UP_TO of its maxmemory, new turns are refused (StoreFull),
so the last part is left for the turns already in flight to finish and write their endings (with
noeviction, a full Redis refuses writes)."""

from __future__ import annotations

import time

import redis

from agent.conversation.errors import StoreFull

NEW_TURNS_UP_TO = 0.9  # of Redis's maxmemory
MEMORY_CHECK_EVERY_S = 1.0  # seconds an INFO memory reading is reused by the same store


class Room:
    """The memory guard of one store: one INFO memory reading at most every MEMORY_CHECK_EVERY_S."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._memory: tuple[float, int, int] | None = None  # (monotonic time, used, maxmemory) last read

    def check(self) -> None:
        """Raise StoreFull when Redis has a memory limit and is past NEW_TURNS_UP_TO of it."""
        now = time.monotonic()
        if self._memory is None or now - self._memory[0] > MEMORY_CHECK_EVERY_S:
            try:
                info = self.client.info("memory")
            except redis.ResponseError:  # a Redis whose ACL refuses INFO: its own refusals still say "full"
                info = {}
            self._memory = (now, int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)))
        _, used, limit = self._memory
        if limit and used >= limit * NEW_TURNS_UP_TO:
            self.forget()  # look again next time: a deletion may have made room
            raise StoreFull(used, limit)

    def forget(self) -> None:
        """Drop the last reading: the next check reads Redis again."""
        self._memory = None
