"""Room in Redis for new turns: past NEW_TURNS_UP_TO of its maxmemory, new turns are refused (StoreFull),
so the last part is left for the turns already in flight to finish and write their endings (with
noeviction, a full Redis refuses writes).

Each accepted turn also reserves RESERVE_BYTES for its final write, as the deadline margin reserves
its time: a turn is accepted only while the memory used plus every reservation of the turns in flight,
its own included, stays under NEW_TURNS_UP_TO of maxmemory. The count is kept in Redis and checked in
the same script that accepts the turn (scripts/begin.lua), so forty messages sent in the same second
cannot all pass a check that each of them made before any of the others was written. The ending
releases the reservation as its first write (scripts/publish.lua), and a Lua script that has written
once runs to its end even past maxmemory: whatever the turns in flight wrote meanwhile, every accepted
turn's ending lands."""

from __future__ import annotations

import time

import redis

from agent.conversation.errors import StoreFull

NEW_TURNS_UP_TO = 0.9  # of Redis's maxmemory
MEMORY_CHECK_EVERY_S = 1.0  # seconds an INFO memory reading is reused by the same store
# Bytes reserved per turn in flight for its final write: a reply at the history's cap (100,000 characters,
# agent/turn/response_limits.py) with its steps and summary, in mostly one-byte characters.
RESERVE_BYTES = 128 * 1024
RESERVATION_TTL_S = 2 * 3600  # seconds a reservation counts at most: past the longest wait plus a run
NO_LIMIT = -1  # reservation room when Redis has no memory limit


class Room:
    """The memory guard of one store: one INFO memory reading at most every MEMORY_CHECK_EVERY_S."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._memory: tuple[float, int, int] | None = None  # (monotonic time, used, maxmemory) last read

    def check(self) -> int:
        """Raise StoreFull when Redis has a memory limit and is past NEW_TURNS_UP_TO of it; else the bytes
        left under it for the reservations of turns in flight (NO_LIMIT without a limit)."""
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
        return int(limit * NEW_TURNS_UP_TO) - used if limit else NO_LIMIT

    def refused(self) -> StoreFull:
        """The refusal of a turn whose reservation did not fit (the script counted the others)."""
        _, used, limit = self._memory or (0, 0, 0)
        self.forget()
        return StoreFull(used, limit)

    def forget(self) -> None:
        """Drop the last reading: the next check reads Redis again."""
        self._memory = None
