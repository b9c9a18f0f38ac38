"""One response's tool calls, in order, each bounded by the time that remains and recorded as a step.

A tool's limit keeps back what the turn's last model call needs (deadline.py), so the turn can still
answer after a slow tool. Every call gets a result in the history (the model needs one for each): its
output, the error of a refused call, or a note that it never ran because time or a stop came first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import redis

from agent import tools as tool_registry
from agent.contract import Kind, Message, Outcome, Role
from agent.conversation.endings import Ending
from agent.providers.base import ToolCall
from agent.runtime.connection import redis_problem
from agent.text.redaction import cut
from agent.turn import approvals
from agent.turn.approvals import DENIED_RESULT, TurnParked, expired_result
from agent.turn.context import TurnContext
from agent.turn.exits import TurnEnded
from agent.turn.response_limits import PlannedCall

log = logging.getLogger(__name__)

RECORDED_CHARS = 2000  # characters of a call's arguments and result kept in its step
NOT_RUN_RESULT = ("Error: not run: too little time was left in this turn to run this tool and still answer; "
                  "answer with what you have")
UNANSWERED_CALL_RESULT = "Error: this tool call was never run: its turn ended first."
LOST_TOOL_RESULT = ("Error: the worker was lost while this tool ran, and the tool was not run again: it may have side "
                    "effects, so it may or may not have taken effect. Say so if it matters.")
UNRECORDED_START_RESULT = ("Error: not run: the conversation could not be saved just before this tool was to start "
                           "(the state store did not answer), and a tool that may have side effects only starts once "
                           "its start is saved, so that it never runs twice. Say so if it matters.")


def idempotency_key(turn_id: str, call_id: str) -> str:
    """One tool run's key, the same on every attempt of the turn (a resume reads the call id back from the
    stored reply): a tool that talks to a system which dedupes by key can be exactly once."""
    return f"{turn_id}:{call_id}"


@dataclass
class ToolRuns:
    """The turn's tool runs, each with the time that remains (less the last call's) as its timeout."""

    context: TurnContext  # its config.tools: the tools this turn may run (None: every tool the worker has)
    history: list[Message]  # what the model sees: each result is added to it and to the state
    used: bool = False  # a tool has run in this turn
    out_of_time: bool = False  # calls were left unrun to keep time for the answer: the next call is the last
    call_ids: set[str] = field(default_factory=set)  # the turn's call ids: a later call reusing one gets a fresh id
    decisions: dict[str, str] = field(default_factory=dict)  # call id -> a person's answer (approvals.py)

    def run_all(self, planned: list[PlannedCall], started: frozenset[str] = frozenset()) -> None:
        """Once no tool can run and leave time for the last call, none is started: the calls left are
        answered in one step, and the turn goes on to that call. The calls that ask a person first go after
        the others (approvals.py), and one that has no answer yet parks the turn. The calls named in
        `started` may have started on a worker that was lost (a resumed turn): each runs again only when it
        is safe to repeat.

        A call of a tool that is not safe to repeat starts only once that it starts is in Redis, with every
        result before it (`before_side_effect`), and its result is written as soon as it returns: so a
        resumed turn knows each call that may have taken effect, and no other. Results of tools that are
        safe to repeat go out in batches."""
        planned = self.asking_last(planned)
        first_result = len(self.history)
        self.call_ids.update(item.call.id for item in planned)
        try:
            for index, item in enumerate(planned):
                self.context.stops.check()
                if item.refusal is not None:
                    self.refuse(item)
                elif (decision := self.decision(item.call)) != Outcome.APPROVED:
                    self.answer(item.call.id, DENIED_RESULT if decision == Outcome.DENIED else
                                expired_result(self.context.config.approval_timeout_s))
                elif item.call.id in started and not tool_registry.safe_to_repeat(item.call.name):
                    self.lost(item.call)
                elif self.context.budget.tool_timeout_s() <= 0:
                    self.not_run(planned[index:])
                    self.context.publishing.tool_landed(self.context.writer, len(planned) - 1, len(planned))
                    return
                else:
                    once = self.run_tool(item.call)
                    self.context.publishing.tool_landed(self.context.writer, index, len(planned), at_once=once)
                    continue
                self.context.publishing.tool_landed(self.context.writer, index, len(planned))
        except TurnEnded:
            # A stop between or during tools: every call still gets a result, so the history can be sent as is.
            answered = {m.get("tool_call_id") for m in self.history[first_result:]}
            for item in planned:
                if item.call.id not in answered:
                    self.answer(item.call.id, UNANSWERED_CALL_RESULT)
            raise

    def asks_first(self, call: ToolCall) -> bool:
        return tool_registry.needs_approval(call.name, self.context.config.approve_tools)

    def asking_last(self, planned: list[PlannedCall]) -> list[PlannedCall]:
        """The calls that need no approval first, in order; then those that ask a person, in order. One that
        asks but cannot show its arguments whole is refused unasked (approvals.refusal_unless_shown)."""
        planned = [replace(item, refusal=approvals.refusal_unless_shown(item.call))
                   if item.refusal is None and self.asks_first(item.call) else item for item in planned]
        asking = [item.refusal is None and self.asks_first(item.call) for item in planned]
        return ([item for item, asks in zip(planned, asking, strict=True) if not asks]
                + [item for item, asks in zip(planned, asking, strict=True) if asks])

    def decision(self, call: ToolCall) -> str:
        """Whether the call may run: APPROVED for a tool that needs no approval, or a person's answer. A call
        with no answer yet parks the turn (TurnParked); with safeguards off the job waits for it itself."""
        if not self.asks_first(call):
            return Outcome.APPROVED
        if call.id not in self.decisions:
            if self.context.publishing.writes_ending_when_killed:
                raise TurnParked(call)
            request = approvals.park(self.context.writer, call, self.context.config, hold=True)
            self.decisions[call.id] = approvals.wait_for_answer(self.context.writer, request, self.context.stops)
        return self.decisions[call.id]

    def answer(self, call_id: str, content: str) -> None:
        message = {"role": Role.TOOL, "tool_call_id": call_id, "content": content}
        self.history.append(message)
        self.context.writer.add_message(message)

    def run_tool(self, call: ToolCall) -> bool:
        """Run one call; True when its tool is not safe to repeat (its result is then written at once)."""
        budget, writer = self.context.budget, self.context.writer
        once = not tool_registry.safe_to_repeat(call.name)
        writer.set_current(Kind.TOOL, call.name, budget.tool_timeout_s(), call_id=call.id)
        if once:
            try:
                self.context.publishing.before_side_effect(writer)
            except redis.RedisError as exc:
                writer.set_current(None)
                self.unrecorded(call, exc)
                return True
        remaining, timeout_s = budget.remaining_s(), budget.tool_timeout_s()
        started = budget.now()
        result = tool_registry.run_tool(call.name, call.arguments, timeout_s=timeout_s, stop=self.context.stops.event,
                                        heartbeat=self.heartbeat, offered=self.context.config.tools,
                                        idempotency_key=idempotency_key(writer.turn_id, call.id))
        self.used = True
        writer.set_current(None)
        self.answer(call.id, result.output)
        outcome = Outcome.STOPPED if result.stopped else Outcome.OK if result.ok else Outcome.ERROR
        writer.add_step(Kind.TOOL, call.name, started, outcome, timeout_s=round(timeout_s, 3),
                        remaining_s=round(remaining, 3), kept_s=round(budget.kept_for_answer_s, 3),
                        arguments=cut(call.arguments, RECORDED_CHARS), result=cut(result.output, RECORDED_CHARS),
                        call_id=call.id)
        if result.stopped:
            # Says what the tool's own result says: it was cut, not finished.
            raise TurnEnded(Ending.cancelled_in_tool(call.name, result.duration_s))
        return once

    def unrecorded(self, call: ToolCall, exc: redis.RedisError) -> None:
        """A call whose start could not be saved: not run, so that a resume can never run it a second time."""
        log.warning("turn %s: %s not started: its start could not be saved: %s", self.context.writer.turn_id,
                    call.name, redis_problem(exc))
        self.answer(call.id, UNRECORDED_START_RESULT)
        self.context.writer.add_step(Kind.TOOL, call.name, self.context.budget.now(), Outcome.ERROR,
                                     arguments=cut(call.arguments, RECORDED_CHARS), result=UNRECORDED_START_RESULT,
                                     call_id=call.id, detail="not run: its start could not be saved")

    def lost(self, call: ToolCall) -> None:
        """A call that may have run on a lost worker, and may have side effects: never run twice."""
        self.answer(call.id, LOST_TOOL_RESULT)
        self.context.writer.add_step(Kind.TOOL, call.name, self.context.budget.now(), Outcome.ERROR,
                                     arguments=cut(call.arguments, RECORDED_CHARS), result=LOST_TOOL_RESULT,
                                     call_id=call.id, detail="not run again: its worker was lost while it ran")

    def heartbeat(self) -> None:
        self.context.publishing.tool_running(self.context.writer)

    def refuse(self, item: PlannedCall) -> None:
        """A call the response's limits refused: its error goes back to the model; nothing runs."""
        self.answer(item.call.id, item.refusal)
        extra = {"refused_calls": item.refused_calls} if item.refused_calls else {}
        self.context.writer.add_step(Kind.TOOL, item.call.name, self.context.budget.now(),
                                     Outcome.REFUSED if item.refused_calls else Outcome.ERROR,
                                     arguments=cut(item.call.arguments, RECORDED_CHARS), result=item.refusal,
                                     call_id=item.call.id, **extra)

    def not_run(self, left: list[PlannedCall]) -> None:
        """Too little time for a tool and a model call after it: every call left is answered in one step,
        and the next call is the last, without tools (or, when even it does not fit, is skipped: the
        turn ends there, saying how much time was left)."""
        budget, writer = self.context.budget, self.context.writer
        for item in left:
            self.answer(item.call.id, item.refusal or NOT_RUN_RESULT)
        not_run = sum(1 for item in left if item.refusal is None)
        noun = "tool call" if not_run == 1 else "tool calls"
        remaining = budget.remaining_s()
        why = f"{remaining:.1f} s left: too little to run {noun} and still call the model after"
        writer.add_step(Kind.TOOL, f"{not_run} {noun} not run", budget.now(), Outcome.SKIPPED,
                        remaining_s=round(remaining, 3), not_run_calls=not_run, arguments="{}", result=NOT_RUN_RESULT,
                        detail=why)
        log.info("turn %s: %d tool calls not run: %s", writer.turn_id, not_run, why)
        self.out_of_time = True


def answer_every_call(history: list[Message]) -> list[Message]:
    """Providers refuse a history with a tool call that has no result (HTTP 400), and a turn
    that was killed or stopped mid-tool leaves one behind: answer it, in what the model sees."""
    answered = {m.get("tool_call_id") for m in history if m.get("role") == Role.TOOL}
    out = []
    for message in history:
        out.append(message)
        for call in message.get("tool_calls") or []:
            if call.get("id") not in answered:
                out.append({"role": Role.TOOL, "tool_call_id": call.get("id"), "content": UNANSWERED_CALL_RESULT})
    return out
