"""Notice a stop request while a step runs.

Stop is a cooperative flag in Redis (the page or the CLI sets it). The turn's own thread is busy
inside the running step (an HTTP call, a tool), so a side thread checks the flag every
STOP_CHECK_S and sets an Event that the running step races against.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

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
