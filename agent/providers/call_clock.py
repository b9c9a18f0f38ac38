"""The clocks of one provider call, seen by the work it does after (or between) network reads.

A call's timeout and its stop event bound the exchange in agent.providers.http; decoding the reply
(agent.providers.sliced_json) is part of the call too. `bounding` makes a call's clock current for
the code it runs, through a context variable (the event loop's tasks copy it), and `run` drives
a stepwise piece of work, checking that clock between steps: past the deadline the call ends as
timed out, with its stop event set as stopped, and a job timeout caught on the way is raised again.
No signals (RQ owns SIGALRM) and no threads: the work runs in the caller's thread and stops there.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from agent import job_alarm
from agent.deadline import CallTimeout
from agent.providers.base import ProviderError, ProviderErrorKind


@dataclass(frozen=True)
class CallClock:
    deadline: float  # time.monotonic() when the call's timeout runs out
    total_s: float  # the call's timeout, for the message
    stop: threading.Event | None

    def check(self) -> None:
        """Raise the ending that has come: a job timeout, a stop, the call's timeout."""
        job_alarm.raise_if_fired()
        if self.stop is not None and self.stop.is_set():
            raise stopped()
        if time.monotonic() >= self.deadline:
            raise timed_out(self.total_s)


_current: contextvars.ContextVar[CallClock | None] = contextvars.ContextVar("call_clock", default=None)


@contextlib.contextmanager
def bounding(timeout: CallTimeout, stop: threading.Event | None) -> Iterator[CallClock]:
    """The call starting now, bounded by `timeout.total_s` and `stop`, is current inside the block;
    inside another call's block, the earlier deadline holds."""
    clock = CallClock(time.monotonic() + timeout.total_s, timeout.total_s, stop)
    outer = _current.get()
    if outer is not None:
        if outer.deadline < clock.deadline:
            clock = CallClock(outer.deadline, outer.total_s, stop)
        if clock.stop is None:
            clock = CallClock(clock.deadline, clock.total_s, outer.stop)
    token = _current.set(clock)
    try:
        yield clock
    finally:
        _current.reset(token)


def run(steps: Generator[None, None, Any]) -> Any:
    """The result of `steps`, the current call's clock checked between steps (none current: unchecked)."""
    clock = _current.get()
    with contextlib.closing(steps):
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            if clock is not None:
                clock.check()


def timed_out(total_s: float) -> ProviderError:
    return ProviderError(ProviderErrorKind.TIMEOUT, f"the provider did not answer within {total_s:.1f} s")


def stopped() -> ProviderError:
    return ProviderError(ProviderErrorKind.STOPPED, "the call was stopped at your request")
