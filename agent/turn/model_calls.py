"""One model round-trip: the call under the time that remains, and its retries inside the same budget.

Each attempt, each wait before a retry, and a call not started for lack of time is a step. The
reply's text goes to the live text as it arrives (safeguards on); a call cut by its timeout, failed
or stopped mid-stream never puts that text in the history: its step keeps it as `partial_text`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent import tools as tool_registry
from agent.contract import ErrorKind, Kind, Message, Outcome, Role, Status, Usage
from agent.deadline import CallTimeout, retry_wait_s
from agent.providers.base import Completion, Provider, ProviderError, ProviderErrorKind
from agent.providers.demo import DEMO
from agent.redaction import cut
from agent.turn.context import TurnContext
from agent.turn.exits import TurnEnded
from agent.turn.history_window import latest_turns

log = logging.getLogger(__name__)

MAX_ATTEMPTS_PER_CALL = 5  # one model round-trip: the first try and up to four retries
PARTIAL_TEXT_CHARS = 20_000  # characters of a cut call's text kept in its step
LAST_CALL_NUDGE = (
    "Time is nearly up for this turn. Answer now, briefly, with what you already have. "
    "Do not call any tools."
)
# The step outcome of a failed call that says why; any other failure is an error.
FAILED_CALL_OUTCOMES = {ProviderErrorKind.STOPPED: Outcome.STOPPED, ProviderErrorKind.TIMEOUT: Outcome.TIMEOUT}


@dataclass
class ModelCalls:
    """The turn's model calls, each with the timeout its clocks give it."""

    context: TurnContext
    provider: Provider

    @property
    def name(self) -> str:
        config = self.context.config  # the demo's model names say what they are ("demo@0.8")
        return config.model if config.provider == DEMO.name else f"{config.provider}:{config.model}"

    def complete(self, history: list[Message], *, last_call: bool) -> Completion:
        """The model's reply; the last call goes out without tools, asking for an answer now."""
        config, stop = self.context.config, self.context.stops.event
        budget, publishing, writer = self.context.budget, self.context.publishing, self.context.writer
        tools = [] if last_call else tool_registry.schemas(config.tools)
        # A long conversation is sent from its latest turns, up to the cap; the stored history stays whole.
        sent, not_sent = latest_turns(history, config.max_history_sent_bytes)
        left_out = {"turns_not_sent": not_sent} if not_sent else {}
        messages = sent + ([{"role": Role.SYSTEM, "content": LAST_CALL_NUDGE}] if last_call else [])
        for attempt in range(1, MAX_ATTEMPTS_PER_CALL + 1):
            remaining = budget.remaining_s()
            timeout = budget.call_timeout()
            if timeout is None:
                self.skip(remaining)
            started = budget.now()
            writer.set_current(Kind.MODEL, self.name, timeout.total_s)
            publishing.publish(writer)
            on_text = publishing.live_text(writer, attempt)
            try:
                completion = self.provider.complete(messages, tools, timeout, stop=stop, on_text=on_text)
            except ProviderError as exc:
                writer.set_current(None)
                partial, arrived = writer.end_live()
                outcome = FAILED_CALL_OUTCOMES.get(exc.kind, Outcome.ERROR)
                self.record(started, outcome, timeout, remaining, attempt=attempt, detail=exc.message,
                            last_call=last_call, **partial_fields(partial, arrived), **left_out)
                if outcome == Outcome.STOPPED:
                    raise TurnEnded(Status.CANCELLED, ErrorKind.CANCELLED,
                                    stopped_call_words(budget.now() - started, arrived)) from None
                self.retry_or_end(exc, attempt)
                continue
            finally:
                writer.end_live()  # also when the queue's alarm or a shutdown cuts the call
            writer.set_current(None)
            usage = usage_of(completion)
            self.record(started, Outcome.OK, timeout, remaining, attempt=attempt, last_call=last_call,
                        tool_calls=len(completion.tool_calls), **({"usage": usage} if usage else {}), **left_out)
            return completion
        raise TurnEnded(Status.FAILED, ErrorKind.RETRIES,
                        f"The model call failed {MAX_ATTEMPTS_PER_CALL} times in a row.")

    def record(self, started: float, outcome: str, timeout: CallTimeout, remaining: float, **extra) -> None:
        self.context.writer.add_step(Kind.MODEL, self.name, started, outcome, timeout_s=round(timeout.total_s, 3),
                                     remaining_s=round(remaining, 3), **extra)

    def skip(self, remaining: float) -> None:
        """Too little time is left to start a call: recorded, and the turn ends saying so."""
        min_call_s, writer = self.context.config.min_call_s, self.context.writer
        writer.add_step(Kind.SKIP, self.name, self.context.budget.now(), Outcome.SKIPPED,
                        remaining_s=round(remaining, 3),
                        detail=f"{remaining:.1f} s left, below the {min_call_s:g} s minimum")
        log.info("turn %s: model call skipped: %.1f s left < %g s minimum", writer.turn_id, remaining, min_call_s)
        raise TurnEnded(
            Status.TIMED_OUT,
            ErrorKind.DEADLINE,
            f"I ran out of time: {remaining:.1f} s were left before the deadline, and a model call "
            f"needs at least {min_call_s:g} s, so I stopped here.",
        )

    def retry_or_end(self, exc: ProviderError, attempt: int) -> None:
        """Sleep before the next attempt when it fits in the budget; otherwise end the turn."""
        budget, writer = self.context.budget, self.context.writer
        status = Status.TIMED_OUT if exc.kind == ProviderErrorKind.TIMEOUT else Status.FAILED
        if not exc.retryable or attempt >= MAX_ATTEMPTS_PER_CALL:
            raise TurnEnded(status, exc.kind, f"The model call failed: {exc.message}.")
        wait_s = retry_wait_s(attempt, exc.retry_after_s)
        if not budget.wait_fits(wait_s):
            if exc.kind == ProviderErrorKind.RATE_LIMITED:
                raise TurnEnded(
                    Status.FAILED,
                    exc.kind,
                    f"The provider is rate-limiting: it asked to wait {wait_s:g} s, which does not fit in the "
                    f"{budget.remaining_s():.1f} s left before the deadline. Try again in a moment.",
                )
            raise TurnEnded(status, exc.kind, f"The model call failed ({exc.message}) and no time is left to retry.")
        started = budget.now()
        writer.set_current(Kind.RETRY, f"wait {wait_s:.1f} s", wait_s)
        self.context.publishing.publish(writer)
        retry = f"attempt {attempt + 1}"
        try:
            self.context.stops.sleep(wait_s)
        except TurnEnded as ended:
            writer.set_current(None)
            writer.add_step(Kind.RETRY, retry, started, Outcome.STOPPED, timeout_s=round(wait_s, 3),
                            remaining_s=round(budget.remaining_s(), 3), detail="stopped at your request")
            if ended.kind == ErrorKind.CANCELLED:  # a stop, not the queue's timeout caught on the way
                raise TurnEnded(Status.CANCELLED, ErrorKind.CANCELLED, "Stopped at your request, while waiting "
                                f"{wait_s:.1f} s before trying the model call again.") from None
            raise
        writer.set_current(None)
        after = f" (Retry-After {exc.retry_after_s:g} s)" if exc.retry_after_s is not None else ""
        writer.add_step(Kind.RETRY, retry, started, Outcome.OK, timeout_s=round(wait_s, 3),
                        remaining_s=round(budget.remaining_s(), 3), detail=f"after {exc.kind}{after}")


def stopped_call_words(into_call_s: float, arrived_chars: int) -> str:
    """What a stop cut, named as it was: the reply being written, or the wait for it to begin."""
    if arrived_chars:
        return (f"Stopped at your request, while the model was writing its reply ({arrived_chars:,} characters "
                f"written, {into_call_s:.1f} s into the call).")
    return f"Stopped at your request, while waiting for the model's reply ({into_call_s:.1f} s into the call)."


def partial_fields(text: str, arrived: int) -> dict:
    """What a cut call's step keeps of the text that arrived before the cut: nothing if none did."""
    if not text:
        return {}
    return {"partial_text": cut(text, PARTIAL_TEXT_CHARS), "partial_chars": arrived}


def usage_of(completion: Completion) -> Usage | None:
    """The tokens the provider reported for the call, if it did."""
    usage = getattr(completion, "usage", None)
    if usage is None:
        return None
    return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
