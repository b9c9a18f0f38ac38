"""One model round-trip: the call under the time that remains, and its retries inside the same budget.

Each attempt, each wait before a retry, and a call not started for lack of time is a step. The
reply's text goes to the live text as it arrives (safeguards on); a call cut by its timeout, failed
or stopped mid-stream never puts that text in the history: its step keeps it as `partial_text`.

A reply with no text and no tool call is not an answer. Some servers stream nothing where a plain
request gets text (or their error): so a stream that came empty, or ended before its end with nothing
in it, is asked again once without streaming, a step of its own that says why (`unstreamed`). An
empty reply that is not asked again ends the turn saying so, in one wording (EMPTY_REPLY).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from agent import tools as tool_registry
from agent.contract import ErrorKind, Kind, Message, Outcome, Role, Usage
from agent.conversation.endings import EMPTY_REPLY, Ending
from agent.deadline import CallTimeout
from agent.providers.base import Completion, Provider, ProviderError, ProviderErrorKind
from agent.providers.demo import DEMO
from agent.providers.retry import MAX_ATTEMPTS_PER_CALL, RETRY_POLICY
from agent.runtime.connection import redis_problem
from agent.spend import CallPlan, Charge, Sent, input_bound, money, pusd_to_usd
from agent.text.redaction import cut
from agent.turn.context import TurnContext
from agent.turn.exits import TurnEnded
from agent.turn.history_window import latest_turns

log = logging.getLogger(__name__)

REDIS_WAIT_S = 0.25  # between tries to save a call's charge while Redis is away
PARTIAL_TEXT_CHARS = 20_000  # characters of a cut call's text kept in its step
LAST_CALL_NUDGE = (
    "Time is nearly up for this turn. Answer now, briefly, with what you already have. "
    "Do not call any tools."
)
BUDGET_NUDGE = (
    "The budget for this turn is nearly spent. Answer now, briefly, with what you already have. "
    "Do not call any tools."
)
NO_TEXT_NO_CALL = "no text and no tool call"
NO_TEXT_ONLY_CALLS = "no text, only tool calls, which the last call does not run"
# Why a call is asked without streaming (its step's `unstreamed`): the words a person reads.
EMPTY_STREAMED = "the streamed reply was empty"
NOTHING_STREAMED = "the stream before ended with nothing in it"
# The step outcome of a failed call that says why; any other failure is an error.
FAILED_CALL_OUTCOMES = {ProviderErrorKind.STOPPED: Outcome.STOPPED, ProviderErrorKind.TIMEOUT: Outcome.TIMEOUT}


@dataclass
class Ask:
    """What one model round-trip sends, the same for each of its attempts, and how it is asked."""

    messages: list[Message]
    tools: list[dict]
    last_call: bool
    step_fields: dict  # what each attempt's step records about what was sent (the history cap)
    history_count: int = 0  # how many of `messages` are the history (after them: the last call's nudge)
    unstreamed: str | None = None  # why it is asked without streaming now; None: it streams


class NoUsefulCall(Exception):
    """A call with tools no longer fits the turn's budget: the turn's last call answers, inside the reserve."""


@dataclass
class ModelCalls:
    """The turn's model calls, each with the timeout its clocks give it."""

    context: TurnContext
    provider: Provider
    sent: Sent | None = None  # what the last completed call sent and counted: the next input bound's base
    kept: tuple[int, int] = (0, 0)  # (tokens, pusd) kept for the answer when the budget made the last call
    answer_cost: Charge | None = None  # what that answer was charged

    @property
    def name(self) -> str:
        config = self.context.config  # the demo's model names say what they are ("demo@0.8")
        return config.model if config.provider == DEMO.name else f"{config.provider}:{config.model}"

    def ask(self, history: list[Message], *, last_call: bool, budget_spent: bool = False) -> Ask:
        """What a round-trip sends: the history (its latest turns, up to the cap; the stored history stays
        whole), and for the last call, a nudge to answer now instead of the tools."""
        config = self.context.config
        sent, not_sent = latest_turns(history, config.max_history_sent_bytes)
        nudge = BUDGET_NUDGE if budget_spent else LAST_CALL_NUDGE
        return Ask(messages=sent + ([{"role": Role.SYSTEM, "content": nudge}] if last_call else []),
                   tools=[] if last_call else tool_registry.schemas(config.tools), last_call=last_call,
                   step_fields={"turns_not_sent": not_sent} if not_sent else {}, history_count=len(sent))

    def plan(self, ask: Ask) -> CallPlan | None:
        """The budget's plan for the call `ask` makes (agent/spend.py), or None when it does not fit."""
        bound = input_bound(ask.messages, ask.tools, ask.history_count, self.sent)
        return self.context.spend.plan(bound, last_call=ask.last_call)

    def useful_call_fits(self, history: list[Message]) -> bool:
        """A call with tools fits what remains of the budget, with the reserve kept for the answer after it."""
        spend = self.context.spend
        if not spend.limited or not spend.clamp:
            return True
        return self.plan(self.ask(history, last_call=False)) is not None

    def complete(self, history: list[Message], *, last_call: bool, budget_spent: bool = False) -> Completion:
        """The model's reply; the last call goes out without tools, asking for an answer now. A reply
        with no text and no tool call is no answer: asked again without streaming when it came as a
        stream and that fits, else the turn ends saying so. `budget_spent`: the budget made this the last
        call (it answers inside the reserve)."""
        ask = self.ask(history, last_call=last_call, budget_spent=budget_spent)
        if budget_spent:  # what is left now is what the answer may use: at least the reserve the calls kept
            spend = self.context.spend
            self.kept = ((spend.budget_tokens or 0) - spend.spent_tokens, (spend.budget_pusd or 0) - spend.spent_pusd)
        for attempt in RETRY_POLICY.attempts():
            try:
                completion = self.attempt(ask, attempt)
            except ProviderError as exc:
                self.retry_or_end(exc, attempt)
                if exc.nothing_streamed and ask.unstreamed is None:
                    ask.unstreamed = NOTHING_STREAMED  # such a server says plainly what went wrong
                continue
            lack = lacks(completion, ask.last_call)
            if lack is None:
                return completion
            ask.unstreamed = self.after_empty_reply(completion, ask, attempt, lack)
        raise TurnEnded(Ending.retries_exhausted(MAX_ATTEMPTS_PER_CALL))

    def attempt(self, ask: Ask, attempt: int) -> Completion:
        """One call and its step. Raises ProviderError (recorded), or TurnEnded when stopped or when
        too little time is left to start it."""
        budget, publishing, writer = self.context.budget, self.context.publishing, self.context.writer
        remaining = budget.remaining_s()
        timeout = budget.call_timeout()
        if timeout is None:
            self.skip(remaining)
        plan = self.plan(ask)
        if plan is None:
            if not ask.last_call:
                raise NoUsefulCall()
            self.skip_for_budget(ask)
        spend = self.context.spend
        writer.set_current(Kind.MODEL, self.name, timeout.total_s)
        if self.charge_saved(plan):  # it waited for Redis: less time is left now
            remaining = budget.remaining_s()
            if (timeout := budget.call_timeout()) is None:
                self.uncharged()
                self.skip(remaining)
            writer.set_current(Kind.MODEL, self.name, timeout.total_s)
        started = budget.now()
        on_text = publishing.live_text(writer, attempt)
        fields = {"attempt": attempt, "last_call": ask.last_call, **ask.step_fields,
                  **({"unstreamed": ask.unstreamed} if ask.unstreamed else {})}
        # Asked only when it must be: a provider that never streams (a scripted test model) takes no `stream`.
        how = {"stream": False} if ask.unstreamed else {}
        if plan.max_tokens is not None:  # asked only with a budget: a provider's own limit otherwise
            how["max_tokens"] = plan.max_tokens
            fields["max_tokens"] = plan.max_tokens
        fields["input_bound"] = plan.input_bound
        try:
            completion = self.provider.complete(ask.messages, ask.tools, timeout, stop=self.context.stops.event,
                                                on_text=on_text, **how)
        except ProviderError as exc:
            writer.set_current(None)
            partial, arrived = writer.end_live()
            outcome = FAILED_CALL_OUTCOMES.get(exc.kind, Outcome.ERROR)
            charge = spend.charge(plan)  # failed or cut: billed perhaps, so charged at its worst case
            writer.doc["spend"] = spend.to_doc()
            self.record(started, outcome, timeout, remaining, detail=exc.message, **partial_fields(partial, arrived),
                        **fields, **cost_fields(charge))
            if outcome == Outcome.STOPPED:
                raise TurnEnded(Ending.cancelled_in_call(budget.now() - started, arrived)) from None
            raise
        finally:
            writer.end_live()  # also when the queue's alarm or a shutdown cuts the call
        writer.set_current(None)
        usage = usage_of(completion)
        reported = completion.usage
        charge = spend.charge(plan, reported.input_tokens if reported else None,
                              reported.output_tokens if reported else None,
                              reported.cached_input_tokens if reported else None)
        writer.doc["spend"] = spend.to_doc()
        self.remember(ask, plan, charge)
        if ask.last_call:
            self.answer_cost = charge
        if charge.over_limit:
            log.warning("turn %s: the provider counted past the call's bound (input bound %d, max_tokens %s): %s",
                        writer.turn_id, plan.input_bound, plan.max_tokens, usage)
        lack = lacks(completion, ask.last_call)  # no answer: the caller says what follows
        empty = {"detail": f"{EMPTY_REPLY.lower()} ({lack})"} if lack else {}
        self.record(started, Outcome.ERROR if empty else Outcome.OK, timeout, remaining,
                    tool_calls=len(completion.tool_calls), **({"usage": usage} if usage else {}), **empty, **fields,
                    **cost_fields(charge))
        return completion

    def charge_saved(self, plan: CallPlan) -> bool:
        """The call's start, with its worst case as in flight, published (a lost worker's call is charged).
        Under a budget it starts only once that write has landed, so that whoever ends or resumes the turn after
        a lost worker charges it: a write that did not land (Redis away) is tried again every REDIS_WAIT_S while
        the deadline lets a call start; a turn given to another attempt meanwhile ends here (the write is
        refused). Returns whether it waited."""
        spend, writer, publishing = self.context.spend, self.context.writer, self.context.publishing
        waited = False
        while True:
            spend.start(plan)
            writer.doc["spend"] = spend.to_doc()
            if not spend.limited:
                publishing.publish(writer)
                return False
            try:
                publishing.before_charged_call(writer)
                return waited
            except redis.RedisError as exc:
                self.uncharged()
                log.warning("turn %s: model call waits: its charge could not be saved: %s", writer.turn_id,
                            redis_problem(exc))
            waited = True
            self.context.stops.sleep(REDIS_WAIT_S)
            if self.context.budget.call_timeout() is None:
                self.skip(self.context.budget.remaining_s())

    def uncharged(self) -> None:
        """The call in flight did not start after all: not charged."""
        self.context.spend.in_flight = None
        self.context.writer.doc["spend"] = self.context.spend.to_doc()

    def remember(self, ask: Ask, plan: CallPlan, charge: Charge) -> None:
        """The base of the next call's input bound: what this one sent, and its tokens as counted (none when
        its output is unknown: no report and no max_tokens)."""
        if not ask.history_count or (charge.worst and plan.max_tokens is None):
            self.sent = None
            return
        self.sent = Sent(first=ask.messages[0], count=ask.history_count, last=ask.messages[ask.history_count - 1],
                         had_tools=bool(ask.tools), tokens=charge.tokens)

    def skip_for_budget(self, ask: Ask) -> None:
        """Not even the answer fits what remains of the budget: recorded, and the turn ends saying so."""
        spend, writer = self.context.spend, self.context.writer
        bound = input_bound(ask.messages, ask.tools, ask.history_count, self.sent)
        writer.add_step(Kind.SKIP, self.name, self.context.budget.now(), Outcome.SKIPPED, input_bound=bound,
                        detail=f"budget: {self.left_words()} left, and an answer needs its input ({bound:,} tokens "
                               "at most) and room to write")
        writer.doc["spend"] = spend.to_doc()
        log.info("turn %s: model call skipped: the budget has %s left", writer.turn_id, self.left_words())
        raise TurnEnded(Ending.budget_spent(self.spent_words(), self.left_words()))

    # -- the budget in words (the endings) ----------------------------------------------------------

    def amount(self, tokens: int, pusd: int | None) -> str:
        priced = self.context.spend.price is not None
        if priced and pusd is not None:
            return f"{money(pusd_to_usd(pusd))} ({tokens:,} tokens)"
        return f"{tokens:,} tokens"

    def spent_words(self) -> str:
        spend = self.context.spend
        budget = " and ".join(part for part in (
            money(pusd_to_usd(spend.budget_pusd)) if spend.budget_pusd is not None else "",
            f"{spend.budget_tokens:,} tokens" if spend.budget_tokens is not None else "") if part)
        return f"{self.amount(spend.spent_tokens, spend.spent_pusd)} of its {budget} budget"

    def left_words(self) -> str:
        spend = self.context.spend
        parts = []
        if spend.budget_pusd is not None:
            parts.append(money(pusd_to_usd(max(0, spend.budget_pusd - spend.spent_pusd))))
        if spend.budget_tokens is not None:
            parts.append(f"{max(0, spend.budget_tokens - spend.spent_tokens):,} tokens")
        return " and ".join(parts)

    def kept_words(self) -> str:
        spend, (kept_tokens, kept_pusd) = self.context.spend, self.kept
        kept = []
        if spend.budget_pusd is not None:
            kept.append(money(pusd_to_usd(max(0, kept_pusd))))
        if spend.budget_tokens is not None:
            kept.append(f"{max(0, kept_tokens):,} tokens")
        took = self.answer_cost
        used = f", and the answer took {self.amount(took.tokens, took.pusd)}" if took else ""
        return f"{' and '.join(kept)} was kept for the answer{used}"

    def overshoot_words(self) -> str:
        spend = self.context.spend
        shares = []
        if spend.budget_pusd:
            shares.append(spend.spent_pusd / spend.budget_pusd)
        if spend.budget_tokens:
            shares.append(spend.spent_tokens / spend.budget_tokens)
        return f"{(max(shares) - 1) * 100:.0f}% over" if shares else "over"

    def after_empty_reply(self, completion: Completion, ask: Ask, attempt: int, lack: str) -> str:
        """An empty reply that came as a stream is asked again once, without streaming (why, returned),
        when an attempt and the time for it are left; otherwise the turn ends saying it was empty."""
        if not completion.streamed or ask.unstreamed is not None:
            raise TurnEnded(Ending.empty_reply(lack, asked_twice=ask.unstreamed == EMPTY_STREAMED))
        if not RETRY_POLICY.attempt_left(attempt):
            raise TurnEnded(Ending.empty_reply(lack, not_asked_again_for="attempt"))
        budget = self.context.budget
        if budget.call_timeout() is None:
            remaining, min_call_s = budget.remaining_s(), self.context.config.min_call_s
            self.context.writer.add_step(
                Kind.SKIP, self.name, budget.now(), Outcome.SKIPPED, remaining_s=round(remaining, 3),
                detail=f"not asked again without streaming: {remaining:.1f} s left, below the {min_call_s:g} s minimum")
            raise TurnEnded(Ending.empty_reply(lack, not_asked_again_for="time"))
        return EMPTY_STREAMED

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
        raise TurnEnded(Ending.deadline(remaining, min_call_s))

    def retry_or_end(self, exc: ProviderError, attempt: int) -> None:
        """Sleep before the next attempt when the retry policy grants one that fits; otherwise end the turn."""
        budget, writer = self.context.budget, self.context.writer
        if (retry := RETRY_POLICY.after(exc, attempt, budget)) is None:
            raise TurnEnded(Ending.call_failed(exc.kind, exc.message))
        wait_s = retry.wait_s
        if not retry.fits:
            if exc.kind == ProviderErrorKind.RATE_LIMITED:
                raise TurnEnded(Ending.rate_limited(wait_s, budget.remaining_s()))
            raise TurnEnded(Ending.call_failed(exc.kind, exc.message, no_time_to_retry=True))
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
            if ended.ending.kind == ErrorKind.CANCELLED:  # a stop, not the queue's timeout caught on the way
                raise TurnEnded(Ending.cancelled_in_retry_wait(wait_s)) from None
            raise
        writer.set_current(None)
        after = f" (Retry-After {exc.retry_after_s:g} s)" if exc.retry_after_s is not None else ""
        writer.add_step(Kind.RETRY, retry, started, Outcome.OK, timeout_s=round(wait_s, 3),
                        remaining_s=round(budget.remaining_s(), 3), detail=f"after {exc.kind}{after}")


def lacks(completion: Completion, last_call: bool) -> str | None:
    """Why a reply is no answer, in words; None when it is one. Blank text is no text, and the last
    call's tool calls are dropped unrun, so a last reply of tool calls alone says nothing either."""
    if (completion.content or "").strip():
        return None
    if not completion.tool_calls:
        return NO_TEXT_NO_CALL
    return NO_TEXT_ONLY_CALLS if last_call else None


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
    found = Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    if getattr(usage, "cached_input_tokens", None) is not None:
        found["cached_input_tokens"] = usage.cached_input_tokens
    return found


def cost_fields(charge: Charge) -> dict:
    """What a model call's step says it cost: tokens, US dollars (None: no price), and whether that is its
    worst case (the provider did not report it, or the call failed or was cut)."""
    return {"cost_tokens": charge.tokens,
            "cost_usd": None if charge.pusd is None else round(pusd_to_usd(charge.pusd), 9),
            **({"cost_worst": True} if charge.worst else {})}
