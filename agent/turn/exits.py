"""How the job leaves its loop: one table from what stopped it to how the turn ends.

However the loop stops (an answer, one of its own limits, the queue's job timeout, a shutdown, a
bug), the job writes an Ending (agent/conversation/endings.py) with the reason in words; only a turn someone
else already ended is left alone, and a turn the app's shutdown interrupted is handed over to the app's next
start instead, while it can be (agent/turn/shutdown.py). The queue's timeout and a shutdown are raised again
once the ending is written, so RQ still sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from rq.timeouts import JobTimeoutException

from agent import job_alarm
from agent.conversation.endings import Ending

log = logging.getLogger(__name__)


class TurnEnded(Exception):
    """The loop stops here, and `ending` is how the turn ends."""

    def __init__(self, ending: Ending):
        super().__init__(ending.message)
        self.ending = ending


class TurnClosed(Exception):
    """Someone else already ended this turn (the page, a stop, a failure callback)."""


@dataclass(frozen=True)
class Exit:
    """The ending to write (None: write nothing), and what to raise once it is written."""

    ending: Ending | None
    reraise: BaseException | None = None
    hand_over: bool = False  # first try to hand the turn over to the app's next start (shutdown.py)


def _internal(exc: BaseException, turn_id: str) -> Ending:
    log.error("turn %s failed", turn_id, exc_info=exc)
    return Ending.internal(type(exc).__name__)


EndingFor = Callable[[BaseException, str, int], Ending | None]

SHUTDOWN = (SystemExit, KeyboardInterrupt)  # the worker is being stopped (the app's shutdown): handed over

# First match wins. (what stopped the loop, the ending it gets, raised again after the ending)
EXITS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], EndingFor, bool], ...] = (
    (TurnClosed, lambda exc, turn_id, job_timeout_s: None, False),
    (TurnEnded, lambda exc, turn_id, job_timeout_s: exc.ending, False),
    # never swallowed: RQ marks the job failed
    (JobTimeoutException, lambda exc, turn_id, job_timeout_s: Ending.job_timeout(job_timeout_s), True),
    # the ending if the turn cannot be handed over (the loop says why instead, when it knows)
    (SHUTDOWN, lambda exc, turn_id, job_timeout_s: Ending.app_stopped("its worker stopped with it"), True),
    (Exception, lambda exc, turn_id, job_timeout_s: _internal(exc, turn_id), False),  # ends with a readable message
)


def exit_for(exc: BaseException, turn_id: str, job_timeout_s: int) -> Exit | None:
    """How the turn ends after `exc`; None for what no row covers (it propagates, unwritten)."""
    if job_alarm.fired() and isinstance(exc, Exception) and not isinstance(exc, (TurnClosed, JobTimeoutException)):
        # The job timeout, caught on the way and turned into another error or ending: it is the cause.
        exc = JobTimeoutException("the queue's job timeout fired")
    for kinds, ending, reraise in EXITS:
        if isinstance(exc, kinds):
            return Exit(ending(exc, turn_id, job_timeout_s), exc if reraise else None, hand_over=kinds is SHUTDOWN)
    return None
