"""Notice a stop request, between steps and while a step runs.

Stop is a cooperative flag in Redis (the page or the CLI sets it). Between steps the turn reads
it; during a step its own thread is busy (an HTTP call, a tool), so a side thread checks the flag
every STOP_CHECK_S and sets an Event that the running step races against.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from agent import job_alarm
from agent.conversation.endings import Ending
from agent.conversation.store import Store
from agent.turn.exits import TurnEnded

log = logging.getLogger(__name__)

STOP_CHECK_S = 0.25  # seconds between checks of the stop flag
CLOSE_WAIT_S = 0.1  # seconds close() waits for the side thread; a check stuck on a stalled Redis is left behind


class StopWatch:
    """`event` is set once `requested()` has returned True; checks run in a daemon thread until close()."""

    def __init__(self, requested: Callable[[], bool], interval_s: float = STOP_CHECK_S):
        self.event = threading.Event()
        self._requested = requested
        self._interval_s = interval_s
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StopWatch:
        self._thread = threading.Thread(target=self._watch, name="stop-watch", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT_S)

    def __enter__(self) -> StopWatch:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _watch(self) -> None:
        while not self._closed.wait(self._interval_s):
            try:
                if self._requested():
                    self.event.set()
                    return
            except Exception:  # noqa: BLE001 - a failed check (Redis hiccup) is retried at the next tick
                log.debug("stop check failed", exc_info=True)


class StopRequests:
    """One turn's stop flag: `check` ends the turn once it is set; `event` is set while a step runs."""

    def __init__(self, store: Store, turn_id: str):
        self.store = store
        self.turn_id = turn_id
        self.event = threading.Event()

    def requested(self) -> bool:
        """The flag itself (read from the stop watch's thread too)."""
        return self.store.cancel_requested(self.turn_id)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While the loop runs, a side thread sets `event` as soon as the flag is seen."""
        with StopWatch(self.requested) as watch:
            self.event = watch.event
            yield

    def check(self) -> None:
        """Between steps: end the turn if a stop was asked for (or raise a job timeout caught on the way)."""
        job_alarm.raise_if_fired()
        if not self.event.is_set():
            try:
                if not self.requested():
                    return
            except redis.RedisError:
                return
        raise TurnEnded(Ending.cancelled())

    def sleep(self, seconds: float) -> None:
        """A wait that a stop request cuts short."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.event.wait(min(STOP_CHECK_S, left))
            self.check()
