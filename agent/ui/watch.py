"""A conversation's event stream, watched from a thread: the page's script thread waits on it in
short slices, so it stays interruptible (Stop, a new message) while Redis sees one blocking read at
a time, and nothing at all is polled while nothing happens. No Streamlit.
"""

from __future__ import annotations

import threading

import redis

from agent.conversation.reads import MAX_BLOCK_MS
from agent.conversation.store import Store
from agent.conversation.well_formed import UnreadableState


class VersionWatch:
    """A daemon thread blocking on the event stream; `wait` returns once the version moved past `seen`."""

    def __init__(self, store: Store, conversation_id: str, seen: int | None):
        self._store = store
        self._cid = conversation_id
        self._seen = seen
        self._moved = threading.Event()
        self._closed = threading.Event()
        self.error: redis.RedisError | UnreadableState | None = None  # raised by `wait`'s caller
        self._thread = threading.Thread(target=self._run, name=f"watch-{conversation_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen = self._seen
        while not self._closed.is_set():
            try:
                version = self._store.wait_version(self._cid, seen, MAX_BLOCK_MS)
            except (redis.RedisError, UnreadableState) as exc:  # said on the page by the run that waits
                self._fail(exc)
                return
            except (ValueError, AttributeError) as exc:  # its client closed under its blocking read
                # redis-py says so as a ValueError or, mid-read, an AttributeError on the dropped buffer.
                if not self._closed.is_set():  # not a shutdown after `close`: the waiting run says it
                    self._fail(redis.ConnectionError(f"the connection closed under the watch ({type(exc).__name__})"))
                return
            if version != seen:
                seen = version
                self._moved.set()
            if version is None:  # expired or deleted: nothing left to block on
                return

    def _fail(self, exc: redis.RedisError | UnreadableState) -> None:
        self.error = exc
        self._moved.set()

    def wait(self, timeout_s: float) -> bool:
        """True when the version moved (or the watch failed: see `error`) since the last True."""
        if not self._moved.wait(timeout_s):
            return False
        self._moved.clear()
        return True

    def close(self) -> None:
        """The thread ends after its current blocking read (at most MAX_BLOCK_MS)."""
        self._closed.set()
