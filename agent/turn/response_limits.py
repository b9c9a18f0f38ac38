"""What one model response may bring into a turn: how many of its tool calls run, and how much
of each field is kept.

A provider may answer with 60,000 tool calls, or with one argument string of 8 MB. The turn runs
at most MAX_TOOL_CALLS_PER_RESPONSE calls and keeps one more as the record of the refusal: its
result, an error, tells the model how many calls were refused. The calls after it are dropped
from the history, so a response adds a bounded amount to the state whatever the model sends.

Each call the history keeps has an id of its own, because a provider refuses a history in which two
calls (or two results) share one. An id that is empty, repeats one of the same reply, or repeats one
used earlier in the turn is the model's mistake, and such a call is kept under a fresh id, so every
call has exactly one result. Within one reply only the first call under an id runs: a repeat is
refused with an error result. A later reply's call is a new request, and runs under its fresh id.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from agent import bounded_json
from agent.providers.base import Completion, ToolCall
from agent.text.redaction import cut

MAX_TOOL_CALLS_PER_RESPONSE = 16  # tool calls run from one model response; the rest are refused
MAX_ARGUMENTS_CHARS = 16_000  # characters of one call's arguments; longer ones are refused, not run
MAX_CONTENT_CHARS = 100_000  # characters of a reply's text kept in the history
MAX_ID_CHARS = 128  # characters of a tool call's id (providers use about 30)
MAX_NAME_CHARS = 128  # characters of a tool's name (a registered tool's name is shorter)
FRESH_ID_PREFIX = "call"  # a fresh id for a call that came without one: call_2, call_3, ...


@dataclass(frozen=True)
class PlannedCall:
    """One tool call as the history keeps it, and whether it runs."""

    call: ToolCall
    refusal: str | None = None  # None: run it; otherwise the error result given instead
    refused_calls: int = 0  # on the record of a refusal by count: how many calls it answers for


@dataclass(frozen=True)
class BoundedResponse:
    completion: Completion  # what the history keeps
    calls: list[PlannedCall]


def bound_response(completion: Completion, used_ids: Collection[str] = ()) -> BoundedResponse:
    """The response cut to what a turn keeps and runs; `used_ids`: the call ids earlier in the turn."""
    content = completion.content
    if content is not None and len(content) > MAX_CONTENT_CHARS:
        content = cut(content, MAX_CONTENT_CHARS) + (
            f"\n\n[The reply was cut here: it had {len(content):,} characters, and at most "
            f"{MAX_CONTENT_CHARS:,} are kept.]"
        )
    total = len(completion.tool_calls)
    planned = [_planned(call) for call in completion.tool_calls[:MAX_TOOL_CALLS_PER_RESPONSE]]
    if total > MAX_TOOL_CALLS_PER_RESPONSE:
        refused = total - MAX_TOOL_CALLS_PER_RESPONSE
        others = f"this call and the {refused - 1:,} after it were" if refused > 1 else "this call was"
        message = (
            f"Error: refused: this response asked for {total:,} tool calls, and at most "
            f"{MAX_TOOL_CALLS_PER_RESPONSE} run per response, so {others} not run. Ask for fewer at a time."
        )
        record = _bounded_call(completion.tool_calls[MAX_TOOL_CALLS_PER_RESPONSE])
        planned.append(PlannedCall(record, message, refused))
    planned = _own_ids(planned, used_ids)
    kept = Completion(content=content, tool_calls=[p.call for p in planned])
    return BoundedResponse(kept, planned)


def _planned(call: ToolCall) -> PlannedCall:
    bounded = _bounded_call(call)
    if len(call.arguments) > MAX_ARGUMENTS_CHARS:
        # The history keeps "{}" for them, so this is the one place their nesting can still be named.
        deep = f" and {bounded_json.TooDeep()}" if bounded_json.exceeds(call.arguments) else ""
        return PlannedCall(bounded, f"Error: the arguments are too long ({len(call.arguments):,} characters; "
                                    f"at most {MAX_ARGUMENTS_CHARS:,}){deep}, so {bounded.name} was not run")
    return PlannedCall(bounded)


def _bounded_call(call: ToolCall) -> ToolCall:
    arguments = call.arguments
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        # Valid JSON, so every provider accepts the history back; the call is refused anyway.
        arguments = "{}"
    return replace(call, id=cut(call.id, MAX_ID_CHARS), name=cut(call.name, MAX_NAME_CHARS), arguments=arguments)


def _own_ids(planned: list[PlannedCall], used_ids: Collection[str]) -> list[PlannedCall]:
    """Every call under an id of its own. An id repeated within the reply runs once (its first call),
    each repeat is refused; an empty id, or one from earlier in the turn, is only replaced."""
    taken = set(used_ids) | {p.call.id for p in planned}
    in_reply: set[str] = set()
    out = []
    for item in planned:
        original = item.call.id
        repeat = original in in_reply
        in_reply.add(original)
        if original and not repeat and original not in used_ids:
            out.append(item)
            continue
        fresh = _fresh_id(original, taken)
        taken.add(fresh)
        refusal = item.refusal
        if original and repeat and refusal is None:
            refusal = (f"Error: not run: this call repeated the id {original!r} of an earlier call in the same "
                       "reply, which ran under it; each tool call needs an id of its own. Ask again if it is "
                       "still needed.")
        out.append(replace(item, call=replace(item.call, id=fresh), refusal=refusal))
    return out


def _fresh_id(original: str, taken: set[str]) -> str:
    """An id no call of the turn has: the original with a number, in the characters every provider accepts."""
    base = cut(original or FRESH_ID_PREFIX, MAX_ID_CHARS - 12)
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    return f"{base}_{number}"
