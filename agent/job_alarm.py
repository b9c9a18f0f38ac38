"""Remember that RQ's job timeout fired, so that no handler on the way can lose it.

RQ raises JobTimeoutException from its SIGALRM handler, in whatever code the job's main thread
is running at that moment. Inside an asyncio callback (a transport reading a socket) the event
loop catches it and reports it as a failed connection, which the caller would then retry as a
provider error. So the handler is wrapped: the alarm is recorded in a flag as well, and the
places that could have swallowed the exception raise it again from the flag.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rq.timeouts import JobTimeoutException

_fired = threading.Event()


@contextmanager
def watching() -> Iterator[None]:
    """Record the job timeout when it fires, for the length of one job.

    Enter at the start of the job, in its main thread. On exit the record is cleared: a later call
    in the same process (a warm thread's next job, a test) is not part of this job."""
    _fired.clear()
    _wrap_alarm_handler()
    try:
        yield
    finally:
        _fired.clear()


def _wrap_alarm_handler() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGALRM)
    if not callable(previous) or getattr(previous, "records_job_alarm", False):
        return

    def handler(signum, frame):
        _fired.set()
        previous(signum, frame)

    handler.records_job_alarm = True
    signal.signal(signal.SIGALRM, handler)


def fired() -> bool:
    return _fired.is_set()


def raise_if_fired() -> None:
    """Raise the job timeout again if it fired and its exception was caught on the way."""
    if _fired.is_set():
        raise JobTimeoutException("the queue's job timeout fired (its exception was caught on the way: raised again)")
