"""The two things "safeguards off" changes, as policies the loop is given.

Clocks: the real `Budget` (agent/deadline.py), or `Unbounded`, the same interface with no
deadline of its own: every call and tool gets NAIVE_TIMEOUT_S, and only the queue's job timeout
stops the turn. Publishing: `PublishEveryStep` (the page follows along, the reply's text
as it is written too), or `WriteAtEnd`, the naive loop that writes once when it ends, and nothing
at all when the queue kills it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.deadline import Budget, CallTimeout, Clock
from agent.turn.writer import StateWriter

NAIVE_TIMEOUT_S = 3600.0  # seconds: what "safeguards off" gives a call or tool (no real bound)
EAGER_PUBLISHED_TOOLS = 4  # the first tools of a response are published one by one, as they land
PUBLISH_INTERVAL_S = 0.25  # seconds: after those, tool results are written at most this often


@dataclass
class Unbounded:
    """Budget's interface without a deadline: nothing is skipped or cut short before the queue's kill."""

    started_at: float
    job_timeout_s: int
    connect_cap_s: float
    min_call_s: float
    clock: Clock = field(default=time.time, repr=False)
    deadline_at = None
    kept_for_answer_s = 0.0  # no deadline, so nothing to keep back for a last call

    @classmethod
    def for_turn(cls, config, started_at: float, clock: Clock = time.time) -> Unbounded:
        return cls(started_at, config.job_timeout_s, config.connect_timeout_s, config.min_call_s, clock)

    @property
    def job_timeout_at(self) -> float:
        return self.started_at + self.job_timeout_s

    def now(self) -> float:
        return self.clock()

    def remaining_s(self) -> float:
        return NAIVE_TIMEOUT_S

    def call_timeout(self) -> CallTimeout:
        return CallTimeout(total_s=NAIVE_TIMEOUT_S, connect_s=self.connect_cap_s)

    def tool_timeout_s(self) -> float:
        return NAIVE_TIMEOUT_S

    def can_call(self) -> bool:
        return True

    def only_one_call_left(self) -> bool:
        return False

    def wait_fits(self, wait_s: float) -> bool:
        return True


Clocks = Budget | Unbounded


class PublishEveryStep:
    """Safeguards on: the state is written before each call and after each response and tool result."""

    writes_ending_when_killed = True

    def publish(self, writer: StateWriter) -> None:
        writer.flush()

    def live_text(self, writer: StateWriter, attempt: int) -> Callable[[str], None] | None:
        """The page follows the text as it is written: the call's `on_text` feeds the live text."""
        return writer.start_live(attempt)

    def tool_landed(self, writer: StateWriter, index: int, count: int, at_once: bool = False) -> None:
        """The first few tools one by one, then in batches: a flood of quick tools is not a flood of writes.
        `at_once`: a tool that is not safe to repeat ran, and its result is written now, so that a loss
        after it keeps the real result."""
        if (at_once or index < EAGER_PUBLISHED_TOOLS or index == count - 1
                or writer.since_last_write_s() >= PUBLISH_INTERVAL_S):
            writer.flush()

    def tool_running(self, writer: StateWriter) -> None:
        """While a tool runs: publish what is pending, and that the tool is running, every so often."""
        if writer.since_last_write_s() >= PUBLISH_INTERVAL_S and writer.has_news():
            writer.flush()

    def before_charged_call(self, writer: StateWriter) -> None:
        """Before a model call under a budget: its worst case is in Redis as in flight (raises
        redis.RedisError when the write did not land), so a lost worker's call is charged."""
        writer.flush(durable=True)

    def before_side_effect(self, writer: StateWriter) -> None:
        """Before a tool that is not safe to repeat starts: every result so far, and that this call starts
        (its call id in `current_step`), are in Redis. A write that did not land raises redis.RedisError,
        and the tool does not start: a resumed turn must know every call that may have taken effect."""
        writer.flush(durable=True)


class WriteAtEnd:
    """Safeguards off: the naive loop. Nothing is written until it ends; killed by the queue, it writes nothing."""

    writes_ending_when_killed = False

    def publish(self, writer: StateWriter) -> None:
        pass

    def live_text(self, writer: StateWriter, attempt: int) -> Callable[[str], None] | None:
        """No live text: nothing shows until the end, the contrast with safeguards on."""
        return None

    def tool_landed(self, writer: StateWriter, index: int, count: int, at_once: bool = False) -> None:
        pass

    def tool_running(self, writer: StateWriter) -> None:
        pass

    def before_charged_call(self, writer: StateWriter) -> None:
        pass

    def before_side_effect(self, writer: StateWriter) -> None:
        pass


Publishing = PublishEveryStep | WriteAtEnd


def policies_for(config, started_at: float, clock: Clock = time.time) -> tuple[Clocks, Publishing]:
    """The turn's clocks and publishing, as its settings ask."""
    if config.safeguards:
        return Budget.for_turn(config, started_at, clock), PublishEveryStep()
    return Unbounded.for_turn(config, started_at, clock), WriteAtEnd()
