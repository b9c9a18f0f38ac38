"""The fourth clock: a turn's budget in tokens and/or US dollars, kept like the deadline.

Pure arithmetic; no I/O. Money is whole picodollars (`pusd`, agent/prices.py). Before every model call:

    input bound B   = first call: the request's JSON bytes + framing   (a byte-level BPE tokenizer never
                      makes more tokens than bytes; JSON holds every byte of every message and tool)
                      later calls: the last call's reported input + output tokens (or its bound and
                      max_tokens when it did not report) + the bytes added since (its own reply's text
                      is its output already) + framing, when the request only grew; the smaller of the two
    a useful call   : B + M + reserve <= what remains, where M (its max_tokens) is set to the most that
                      fits, and reserve = the answer's call after it: (B + M + framing + tool results
                      allowance) input, ANSWER_TOKENS output
    the last call   : without tools, inside the reserve: B + M <= what remains
    no useful call fits (M < MIN_USEFUL_TOKENS): none starts, the last call answers; no answer fits
    (M < MIN_ANSWER_TOKENS): none starts, the turn ends saying the budget is spent

Each call is charged what its provider reports; a call that failed, was cut, or did not report is charged
its worst case (B and M), so the sum charged is never below what was billed. Safeguards off, the budget is
only checked after each call (no max_tokens is asked for): the overshoot the clamp prevents.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from agent.prices import Price, price_for, pusd_to_usd, usd_to_pusd

REQUEST_ALLOWANCE_TOKENS = 16  # tokens a chat template may add around a whole request
MESSAGE_FRAMING_TOKENS = 8  # tokens a template may add around one message (role markers, separators)
# Tools add a hidden system prompt at some providers (Anthropic documents one of a few hundred tokens).
TOOLS_ALLOWANCE_TOKENS = 600
TOOL_RESULTS_ALLOWANCE_TOKENS = 512  # tokens of tool results a reserve expects after a useful call
ANSWER_TOKENS = 256  # tokens of output the reserve keeps for the last answer
MIN_USEFUL_TOKENS = 128  # a call with tools that may write fewer is not started: the last call answers instead
MIN_ANSWER_TOKENS = 32  # a last call that may write fewer is not started: the turn ends with a sentence


def turn_price(config) -> Price | None:
    """The price a turn is charged at: the one fixed with it, else (a config built without one) the shipped table's."""
    return Price.from_dict(config.price) if getattr(config, "price", None) else price_for(config.model)


def json_bytes(value) -> int:
    """Bytes of `value` as ASCII JSON: at least the UTF-8 bytes of every string in it (a character
    outside ASCII is 6 or 12 bytes escaped, at most 4 in UTF-8)."""
    return len(json.dumps(value, separators=(",", ":")))


def full_bound(messages: list[dict], tools: list[dict]) -> int:
    """An upper bound on a request's input tokens from its bytes alone."""
    return (json_bytes(messages) + len(messages) * MESSAGE_FRAMING_TOKENS + REQUEST_ALLOWANCE_TOKENS
            + (json_bytes(tools) + TOOLS_ALLOWANCE_TOKENS if tools else 0))


@dataclass(frozen=True)
class Sent:
    """What the last call sent, and what it is known to have counted: the base of the next call's bound."""

    first: dict | None  # its first message (the object), to see the next request starts the same
    count: int  # messages of the history it sent (not the last call's nudge)
    last: dict | None  # its last message of the history
    had_tools: bool
    tokens: int  # its input + output tokens as reported, or its bound and max_tokens where not


def input_bound(messages: list[dict], tools: list[dict], history_count: int, before: Sent | None) -> int:
    """The bound on this request's input tokens (`history_count`: how many of `messages` are the history;
    any after are the last call's nudge)."""
    bound = full_bound(messages, tools)
    if (before is None or before.count == 0 or history_count < before.count or (tools and not before.had_tools)
            or messages[0] is not before.first or messages[before.count - 1] is not before.last):
        return bound
    added = messages[before.count:]
    grown = before.tokens + json_bytes(added) + len(added) * MESSAGE_FRAMING_TOKENS
    if added and added[0].get("role") == "assistant":
        # The last call's own reply: its text is tokens it wrote (counted as its output); its tool calls,
        # which a provider may write out again in another form, are counted by their bytes.
        grown -= json_bytes(added[0]) - json_bytes(added[0].get("tool_calls") or [])
    return min(bound, grown)


@dataclass(frozen=True)
class CallPlan:
    """One call's budget: its input bound, the max_tokens it asks for (None: none asked), its worst case,
    and what stays kept for the answer after it."""

    input_bound: int
    max_tokens: int | None
    worst_tokens: int
    worst_pusd: int | None
    reserve_tokens: int = 0
    reserve_pusd: int = 0


@dataclass(frozen=True)
class Charge:
    """What one call was charged: reported, or (`worst`) its worst case where the provider did not say."""

    tokens: int
    pusd: int | None
    worst: bool
    over_limit: bool = False  # the provider counted past the bound or max_tokens (a server that ignores it)


@dataclass
class Spend:
    """A turn's spend against its budget (None: no budget of that kind). `price` None: tokens only."""

    budget_tokens: int | None = None
    budget_pusd: int | None = None
    price: Price | None = None
    clamp: bool = True  # safeguards on; off, the budget is only checked after each call
    spent_tokens: int = 0
    spent_pusd: int = 0
    in_flight: CallPlan | None = None  # the call running now, charged at its worst case if its worker is lost
    reserve_tokens: int = 0
    reserve_pusd: int = 0
    max_output_tokens: int = 0  # the most a reply may be asked for (the price table's; 0: its default)

    @property
    def limited(self) -> bool:
        return self.budget_tokens is not None or self.budget_pusd is not None

    def plan(self, bound: int, *, last_call: bool) -> CallPlan | None:
        """The plan of a call whose input is at most `bound` tokens, or None when none fits (a useful one,
        or with `last_call` the answer)."""
        p_in, p_out = self._rates()
        if not self.limited or not self.clamp:
            worst_pusd = bound * p_in if self.price is not None else None
            return CallPlan(bound, None, bound, worst_pusd)
        cap = self.max_output_tokens or (self.price.max_output_tokens if self.price else 0) or 4096
        room_tokens = None if self.budget_tokens is None else self.budget_tokens - self.spent_tokens
        room_pusd = None if self.budget_pusd is None else self.budget_pusd - self.spent_pusd
        kept_in = MESSAGE_FRAMING_TOKENS + TOOL_RESULTS_ALLOWANCE_TOKENS
        most = cap
        if last_call:
            if room_tokens is not None:
                most = min(most, room_tokens - bound)
            if room_pusd is not None:
                most = min(most, (room_pusd - bound * p_in) // p_out if p_out else cap)
            if most < MIN_ANSWER_TOKENS:
                return None
            return CallPlan(bound, most, bound + most, bound * p_in + most * p_out)
        # A useful call writes M, and the answer after it reads B + M + what its tools add, and writes ANSWER.
        if room_tokens is not None:
            most = min(most, (room_tokens - 2 * bound - kept_in - ANSWER_TOKENS) // 2)
        if room_pusd is not None:
            most = min(most, (room_pusd - (2 * bound + kept_in) * p_in - ANSWER_TOKENS * p_out) // (p_in + p_out)
                       if p_in + p_out else cap)
        if most < MIN_USEFUL_TOKENS:
            return None
        reserve_tokens = bound + most + kept_in + ANSWER_TOKENS
        return CallPlan(bound, most, bound + most, bound * p_in + most * p_out, reserve_tokens,
                        (bound + most + kept_in) * p_in + ANSWER_TOKENS * p_out)

    def start(self, plan: CallPlan) -> None:
        """A call starts: until it is charged, its worst case counts as spent (a lost worker's call was billed)."""
        self.in_flight = plan
        if plan.reserve_tokens or plan.reserve_pusd:
            self.reserve_tokens, self.reserve_pusd = plan.reserve_tokens, plan.reserve_pusd
        elif plan.max_tokens is not None:  # the last call: it is spending the reserve
            self.reserve_tokens, self.reserve_pusd = 0, 0

    def charge(self, plan: CallPlan, input_tokens: int | None = None, output_tokens: int | None = None,
               cached_input_tokens: int | None = None) -> Charge:
        """Charge a call that ended: what its provider reported, its worst case for what it did not."""
        self.in_flight = None
        p_in, p_out = self._rates()
        worst = input_tokens is None or output_tokens is None
        tokens_in = plan.input_bound if input_tokens is None else input_tokens
        if output_tokens is not None:
            tokens_out = output_tokens
        else:
            tokens_out = plan.max_tokens or 0
        cached = min(cached_input_tokens or 0, tokens_in) if input_tokens is not None else 0
        over = (input_tokens is not None and input_tokens > plan.input_bound) or (
            output_tokens is not None and plan.max_tokens is not None and output_tokens > plan.max_tokens)
        pusd = None
        if self.price is not None:
            pusd = (tokens_in - cached) * p_in + cached * self.price.cached_input_pusd + tokens_out * p_out
            self.spent_pusd += pusd
        self.spent_tokens += tokens_in + tokens_out
        return Charge(tokens_in + tokens_out, pusd, worst, over)

    def charge_lost(self) -> None:
        """The call in flight when its worker was lost: billed, perhaps, so charged at its worst case."""
        if self.in_flight is not None:
            self.spent_tokens += self.in_flight.worst_tokens
            self.spent_pusd += self.in_flight.worst_pusd or 0
            self.in_flight = None

    def exceeded(self) -> bool:
        """Spent is at or past a budget: what the check after each call sees (safeguards off)."""
        return ((self.budget_tokens is not None and self.spent_tokens >= self.budget_tokens)
                or (self.budget_pusd is not None and self.spent_pusd >= self.budget_pusd))

    def over(self) -> bool:
        """Spent is past a budget: the overshoot that must never happen with the clamp."""
        return ((self.budget_tokens is not None and self.spent_tokens > self.budget_tokens)
                or (self.budget_pusd is not None and self.spent_pusd > self.budget_pusd))

    def _rates(self) -> tuple[int, int]:
        return (self.price.input_pusd, self.price.output_pusd) if self.price is not None else (0, 0)

    # -- the state's `spend` ---------------------------------------------------------------------

    def to_doc(self) -> dict:
        """The state's `spend` field: spent, the budgets and the reserve, in tokens and US dollars (exact in pusd)."""
        usd = self.price is not None
        flight = self.in_flight
        return {
            "tokens": self.spent_tokens,
            "usd": pusd_to_usd(self.spent_pusd) if usd else None,
            "pusd": self.spent_pusd if usd else None,
            "budget_tokens": self.budget_tokens,
            "budget_usd": pusd_to_usd(self.budget_pusd) if self.budget_pusd is not None else None,
            "reserve_tokens": self.reserve_tokens if self.limited else None,
            "reserve_usd": pusd_to_usd(self.reserve_pusd) if self.limited and usd else None,
            "in_flight_tokens": flight.worst_tokens if flight else 0,
            "in_flight_pusd": (flight.worst_pusd or 0) if flight and usd else 0,
            "checked": "before each call" if self.clamp else "after each call",
        }

    @classmethod
    def for_turn(cls, config, doc: dict | None = None) -> Spend:
        """A turn's spend from its settings, carrying on from `doc` (its state's `spend`, when resumed or
        continued after an approval): a call that was in flight is charged at its worst case."""
        price = turn_price(config)
        budget_usd = getattr(config, "budget_usd", None)
        spend = cls(budget_tokens=getattr(config, "budget_tokens", None),
                    budget_pusd=usd_to_pusd(budget_usd) if budget_usd is not None and price is not None else None,
                    price=price, clamp=bool(getattr(config, "safeguards", True)))
        if doc:
            spend.spent_tokens = int(doc.get("tokens") or 0) + int(doc.get("in_flight_tokens") or 0)
            spend.spent_pusd = int(doc.get("pusd") or 0) + int(doc.get("in_flight_pusd") or 0)
            spend.reserve_tokens = int(doc.get("reserve_tokens") or 0)
            spend.reserve_pusd = usd_to_pusd(doc["reserve_usd"]) if doc.get("reserve_usd") else 0
        return spend


def money(usd: float | None) -> str:
    """US dollars as a person reads them: $0.0123 below a dollar (a turn costs fractions of a cent), $1.25 above."""
    if usd is None:
        return "no price"
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.4f}"


def tokens_text(tokens: int | None) -> str:
    return "no limit" if tokens is None else f"{tokens:,} tokens"


# -- a spend (the state's `spend`) in words, for the page, the CLI and the export ----------------------


def spent_text(doc: dict | None) -> str:
    """"$0.0205 (4,816 tokens)", or "4,816 tokens" without a price; "" for no spend."""
    if not doc or doc.get("tokens") is None:
        return ""
    tokens = f"{doc['tokens']:,} tokens"
    return f"{money(doc['usd'])} ({tokens})" if doc.get("usd") is not None else tokens


def budget_text(doc: dict | None) -> str:
    """"$0.03", "20,000 tokens", "$0.03 and 20,000 tokens"; "" without a budget."""
    if not doc:
        return ""
    parts = []
    if doc.get("budget_usd") is not None:
        parts.append(money(doc["budget_usd"]))
    if doc.get("budget_tokens") is not None:
        parts.append(f"{doc['budget_tokens']:,} tokens")
    return " and ".join(parts)


def spend_words(doc: dict | None) -> str:
    """A turn's cost in words: "$0.0205 (4,816 tokens) of a $0.03 budget"; "" when it spent nothing."""
    spent = spent_text(doc)
    if not spent:
        return ""
    budget = budget_text(doc)
    return f"{spent} of a {budget} budget" if budget else spent


def total(docs: list[dict | None]) -> dict:
    """The spend of several turns added up: {"tokens", "usd" (None when none was priced), "turns"}."""
    counted = [doc for doc in docs if doc and doc.get("tokens") is not None]
    priced = [doc["usd"] for doc in counted if doc.get("usd") is not None]
    return {"tokens": sum(doc["tokens"] for doc in counted), "usd": sum(priced) if priced else None,
            "turns": len(counted)}
