"""How the job leaves its loop: one table from what stopped it to how the turn ends.

However the loop stops (an answer, one of its own limits, the queue's job timeout, a shutdown, a
bug), the job writes an ending with the reason in words; only a turn someone else already ended
is left alone. The queue's timeout and a shutdown are raised again once the ending is written,
so RQ still sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from rq.timeouts import JobTimeoutException

from agent import job_alarm
from agent.contract import ErrorKind, Status

log = logging.getLogger(__name__)


class TurnEnded(Exception):
    """The loop stops here; `status` and `message` become the ending."""

    def __init__(self, status: str, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


class TurnClosed(Exception):
    """Someone else already ended this turn (the page, a stop, a failure callback)."""


ANSWERED = TurnEnded(Status.DONE, "", "")  # the loop returned: the answer is the ending


@dataclass(frozen=True)
class Exit:
    """The ending to write (None: write nothing), and what to raise once it is written."""

    ending: TurnEnded | None
    reraise: BaseException | None = None


def _job_timeout(exc: BaseException, turn_id: str, job_timeout_s: int) -> TurnEnded:
    return TurnEnded(Status.TIMED_OUT, ErrorKind.JOB_TIMEOUT,
                     f"The queue's job timeout ({job_timeout_s} s) stopped this turn before it finished.")


def _shutdown(exc: BaseException, turn_id: str, job_timeout_s: int) -> TurnEnded:
    return TurnEnded(Status.CANCELLED, ErrorKind.SHUTDOWN, "The worker shut down while writing this reply.")


def _internal(exc: BaseException, turn_id: str, job_timeout_s: int) -> TurnEnded:
    log.error("turn %s failed", turn_id, exc_info=exc)
    return TurnEnded(Status.FAILED, ErrorKind.INTERNAL,
                     f"Something went wrong inside the agent ({type(exc).__name__}).")


Ending = Callable[[BaseException, str, int], TurnEnded | None]

# First match wins. (what stopped the loop, the ending it gets, raised again after the ending)
EXITS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], Ending, bool], ...] = (
    (TurnClosed, lambda exc, turn_id, job_timeout_s: None, False),
    (TurnEnded, lambda exc, turn_id, job_timeout_s: exc, False),
    (JobTimeoutException, _job_timeout, True),  # never swallowed: RQ marks the job failed
    ((SystemExit, KeyboardInterrupt), _shutdown, True),
    (Exception, _internal, False),  # the turn must end with a readable message
)


def exit_for(exc: BaseException, turn_id: str, job_timeout_s: int) -> Exit | None:
    """How the turn ends after `exc`; None for what no row covers (it propagates, unwritten)."""
    if job_alarm.fired() and isinstance(exc, Exception) and not isinstance(exc, (TurnClosed, JobTimeoutException)):
        # The job timeout, caught on the way and turned into another error or ending: it is the cause.
        exc = JobTimeoutException("the queue's job timeout fired")
    for kinds, ending, reraise in EXITS:
        if isinstance(exc, kinds):
            return Exit(ending(exc, turn_id, job_timeout_s), exc if reraise else None)
    return None
