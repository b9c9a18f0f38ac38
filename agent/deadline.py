"""The three clocks: call timeout, the turn's own deadline, the queue's job timeout.

Pure arithmetic with an injectable clock; no I/O. Every time is epoch seconds.

    deadline     = job start + job timeout - margin
    remaining    = max(0, deadline - now)
    call timeout = min(cap, remaining), connect = min(connect cap, remaining)
    tool timeout = max(0, min(tool cap, remaining - minimum - cut slack))
    no call starts when remaining < minimum

A tool's time limit keeps back what the turn's last model call needs (the minimum, and a moment for
the tool's cut and its write), so a tool that runs to its limit still leaves time for an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]

# Seconds past the job timeout before a silent turn counts as lost (agent/hosting/lost_worker.py): its ending
# is written then, so a conversation's state must live at least the job timeout plus this.
LOST_GRACE_S = 5.0
TOOL_CUT_SLACK_S = 0.25  # seconds a tool's limit also keeps back: its cut (a wait slice) and its result's write


@dataclass(frozen=True)
class CallTimeout:
    """The bound on one provider call: total covers connect, headers and body."""

    total_s: float
    connect_s: float


@dataclass
class Budget:
    started_at: float
    job_timeout_s: int
    margin_s: float
    cap_s: float
    connect_cap_s: float
    min_call_s: float
    clock: Clock = field(default=time.time, repr=False)
    tool_cap_s: float = float("inf")  # seconds, the most one tool run gets

    @classmethod
    def for_turn(cls, config, started_at: float, clock: Clock = time.time) -> Budget:
        """A budget from a TurnConfig (anything with its clock fields)."""
        return cls(
            started_at=started_at,
            job_timeout_s=config.job_timeout_s,
            margin_s=config.deadline_margin_s,
            cap_s=config.call_timeout_cap_s,
            connect_cap_s=config.connect_timeout_s,
            min_call_s=config.min_call_s,
            clock=clock,
            tool_cap_s=config.tool_timeout_cap_s,
        )

    @property
    def job_timeout_at(self) -> float:
        return self.started_at + self.job_timeout_s

    @property
    def deadline_at(self) -> float:
        return self.job_timeout_at - self.margin_s

    def now(self) -> float:
        return self.clock()

    def remaining_s(self) -> float:
        return max(0.0, self.deadline_at - self.clock())

    def can_call(self) -> bool:
        return self.remaining_s() >= self.min_call_s

    def call_timeout(self) -> CallTimeout | None:
        """The timeout for a call starting now, or None when too little remains to start one."""
        remaining = self.remaining_s()
        if remaining < self.min_call_s:
            return None
        return CallTimeout(total_s=min(self.cap_s, remaining), connect_s=min(self.connect_cap_s, remaining))

    @property
    def kept_for_answer_s(self) -> float:
        """What a tool's limit keeps back from the time left, so the last model call can still start."""
        return self.min_call_s + TOOL_CUT_SLACK_S

    def tool_timeout_s(self) -> float:
        """The timeout for a tool run starting now: what remains less what the last call needs, at
        most the tool cap, never below zero (zero: no tool can run and still leave time to answer)."""
        return max(0.0, min(self.tool_cap_s, self.remaining_s() - self.kept_for_answer_s))

    def only_one_call_left(self) -> bool:
        """True when a call fits now but a second one after it could not start."""
        remaining = self.remaining_s()
        return self.min_call_s <= remaining < 2 * self.min_call_s

    def wait_fits(self, wait_s: float) -> bool:
        """A wait (backoff, Retry-After) fits when a call can still start after it."""
        return self.remaining_s() - wait_s >= self.min_call_s

