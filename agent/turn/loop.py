"""The turn loop: model call -> tool runs -> model call ..., at most max_steps round-trips.

However the loop ends (answer, step limit, deadline, provider error, stop request, the queue's
own timeout, a shutdown), the ending is written with done=true and the reason in the chat; see
exits.py for the table. What "safeguards off" changes comes in as two policies (policies.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

import redis

from agent import tracing
from agent.contract import Kind, Message, Outcome, Role, Status, TurnDoc
from agent.conversation.endings import Ending
from agent.conversation.store import Store
from agent.deadline import Clock
from agent.providers import make_provider
from agent.providers.base import ProviderError, ToolCall
from agent.runtime.connection import redis_problem
from agent.settings import TurnConfig
from agent.spend import Spend
from agent.turn import approvals, shutdown
from agent.turn.approvals import TurnParked
from agent.turn.context import TurnContext
from agent.turn.exits import Exit, TurnClosed, TurnEnded, exit_for
from agent.turn.model_calls import ModelCalls, NoUsefulCall
from agent.turn.policies import policies_for
from agent.turn.response_limits import PlannedCall, bound_response
from agent.turn.resume import Resumption
from agent.turn.stop_watch import StopRequests
from agent.turn.tool_runs import ToolRuns
from agent.turn.writer import StateWriter

log = logging.getLogger(__name__)

MAX_RECORDED_STEPS = 400  # steps one turn may record; a round already started may add one round's worth


@dataclass
class Turn:
    """One turn: its context (clocks, publishing, writer, stop requests) and what the model sees."""

    context: TurnContext
    history: list[Message]  # what the model sees
    resumption: Resumption | None = None  # this job continues the turn of a lost worker (resume.py)
    tools: ToolRuns = field(init=False)

    def __post_init__(self) -> None:
        self.tools = ToolRuns(self.context, self.history)

    @classmethod
    def create(cls, store: Store, conversation_id: str, turn_id: str, config: TurnConfig, *, started_at: float,
               history: list[Message], doc: TurnDoc, persisted_len: int, clock: Clock = time.time, writer: str = "",
               resumption: Resumption | None = None, turn_start: int | None = None) -> Turn:
        """A turn with the clocks and publishing its settings ask for; `writer` is the job that writes it.
        `history` is what the model is sent (the path from the first turn to this one); the stored path's first
        `persisted_len` messages are written, this turn's from `turn_start` (default: the last of them)."""
        budget, publishing = policies_for(config, started_at, clock)
        writer = StateWriter(store, conversation_id, turn_id, doc, persisted_len, budget.now, writer, turn_start)
        spend = Spend.for_turn(config, doc.get("spend"))  # carried on: a resumed or continued turn keeps its spend
        writer.doc["spend"] = spend.to_doc()
        return cls(TurnContext(config, budget, publishing, writer, StopRequests(store, turn_id), spend), history,
                   resumption)

    def run(self) -> str:
        """Run the turn and write its ending; the queue's timeout and a shutdown are raised again after it."""
        try:
            model = self.start()
            with self.context.stops.watching():
                self.loop(model)
            leaving = Exit(Ending.answered())
        except TurnParked as parked:
            return self.park(parked.call)
        except BaseException as exc:  # noqa: BLE001 - every way out is in the one table (exits.py)
            leaving = exit_for(exc, self.context.writer.turn_id, self.context.config.job_timeout_s)
            if leaving is None:
                raise
        if leaving.ending is None:
            log.info("turn %s was ended elsewhere; this job stops without writing", self.context.writer.turn_id)
            return "closed"
        if leaving.hand_over and self.context.publishing.writes_ending_when_killed:
            why = self.hand_over()
            if why is None:
                raise leaving.reraise  # the app's next start continues it, or someone ended it already
            leaving = replace(leaving, ending=Ending.app_stopped(why))
        if leaving.reraise is None or self.context.publishing.writes_ending_when_killed:
            writer = self.context.writer
            if not self.finish(leaving.ending) and leaving.reraise is None:
                log.info("turn %s: its ending was refused (ended, or resumed, elsewhere)", writer.turn_id)
                return "closed"
            tracing.turn_ended(writer.store, writer.conversation_id, writer.turn_id)
        if leaving.reraise is not None:
            raise leaving.reraise
        return leaving.ending.status

    def hand_over(self) -> str | None:
        """The app is stopping: what the turn has is written, and the turn handed to the app's next start
        (shutdown.py). None when that is done (or the turn was ended elsewhere); else why it could not be."""
        writer = self.context.writer
        if not writer.writer_job:
            return "it was not run by a queued job"
        try:
            writer.flush()
        except TurnClosed:
            return None
        return shutdown.hand_over(writer.store, writer.conversation_id, writer.turn_id, writer.writer_job)

    def park(self, call: ToolCall) -> str:
        """A tool that asks a person first: the request is written and the turn let go; the worker is free."""
        try:
            approvals.park(self.context.writer, call, self.context.config)
        except TurnClosed:
            log.info("turn %s: its request for approval was refused (ended elsewhere)", self.context.writer.turn_id)
            return "closed"
        except redis.RedisError as exc:  # still running in the watch's index: its heartbeat lapses, it resumes
            log.warning("turn %s: could not park it (%s); the pool's watch takes it from here",
                        self.context.writer.turn_id, redis_problem(exc))
            return "not parked"
        return "parked"

    def start(self) -> ModelCalls:
        budget = self.context.budget
        self.context.writer.doc.update(status=Status.RUNNING, started_at=budget.started_at,
                                       deadline_at=budget.deadline_at, job_timeout_at=budget.job_timeout_at)
        if self.resumption is not None:
            self.take_over(self.resumption)
            if self.resumption.after_answer:
                self.context.writer.doc["status"] = Status.RUNNING
        self.context.publishing.publish(self.context.writer)
        try:
            provider = make_provider(self.context.config)
        except ProviderError as exc:  # a server the key may not go to, a bad key: the turn ends in words
            raise TurnEnded(Ending.no_provider(exc.kind, exc.message)) from None
        return ModelCalls(self.context, provider)

    def take_over(self, resumption: Resumption) -> None:
        """A resumed turn: the gap is recorded as a step, a text the loss cut is kept on it and cleared."""
        writer, budget = self.context.writer, self.context.budget
        writer.step_index = resumption.steps
        writer.live.seq = writer.live_to_clear = resumption.live_seq
        self.tools.call_ids.update(resumption.call_ids)
        # (A turn queued again before it began has run no tool: earlier turns' results are not its own.)
        self.tools.used = (resumption.after_answer or not resumption.requeued) and any(
            m.get("role") == Role.TOOL for m in self.history)
        if resumption.answered is not None:
            call_id, answer = resumption.answered
            self.tools.decisions[call_id] = answer
        writer.doc.update(attempt=resumption.attempt, job_id=writer.writer_job)
        remaining = budget.remaining_s()
        if resumption.requeued:  # its job was lost before it began: this one begins it, on fresh clocks
            what = "going on after the answer" if resumption.after_answer else "starting this reply"
            if shutdown.stopped_with_the_app(writer.writer_job):
                name, detail = "app stopped", f"the app was stopped before {what}; started when a worker started again"
            else:
                name, detail = "worker lost", (f"the worker that took this turn from the queue was lost before {what}; "
                                               "queued again and started on another worker")
            writer.add_step(Kind.RESUME, f"{name}: resume {resumption.attempt}", resumption.lost_at, Outcome.OK,
                            remaining_s=round(remaining, 3), attempt=resumption.attempt,
                            detail=f"{detail} with {remaining:.1f} s left before the deadline")
            log.warning("turn %s: queued again after a lost job (attempt %d), %.1f s before its deadline",
                        writer.turn_id, resumption.attempt, remaining)
            return
        if resumption.after_answer:  # the continuation after a person's answer: its step is written already
            return
        started = [call for call in resumption.pending if call.id in resumption.started]
        doing = (f"while the {started[0].name} tool ran" if started else
                 "between tool runs" if resumption.pending else
                 "while the model was writing its reply" if resumption.partial_text else "during a model call")
        extra = {"partial_text": resumption.partial_text} if resumption.partial_text else {}
        if shutdown.stopped_with_the_app(writer.writer_job):  # handed over by its worker as the app stopped
            name, detail = "app stopped", f"the app was stopped {doing}; resumed when a worker started again"
        else:
            name, detail = "worker lost", f"the worker was lost {doing}; resumed on another worker"
        writer.add_step(Kind.RESUME, f"{name}: resume {resumption.attempt}",
                        resumption.lost_at, Outcome.OK, remaining_s=round(remaining, 3), attempt=resumption.attempt,
                        detail=f"{detail} with {remaining:.1f} s left before the deadline", **extra)
        log.warning("turn %s: resumed (attempt %d), %.1f s before its deadline", writer.turn_id, resumption.attempt,
                    remaining)

    def loop(self, model: ModelCalls) -> None:
        rounds = 0
        if self.resumption is not None:
            rounds = self.resumption.rounds
            if self.resumption.pending:
                self.tools.run_all([PlannedCall(call) for call in self.resumption.pending],
                                   started=frozenset() if self.resumption.after_answer else self.resumption.started)
        for _ in range(max(0, self.context.config.max_steps - rounds)):
            self.context.stops.check()
            if (recorded := self.context.writer.step_index) >= MAX_RECORDED_STEPS:
                raise TurnEnded(Ending.recorded_steps_limit(recorded))
            # The last call goes without tools: after a tool, when only one call fits, or when tools were
            # left unrun to keep its time.
            last_call = self.tools.out_of_time or (self.tools.used and self.context.budget.only_one_call_left())
            # The fourth clock: when no useful call fits the budget, the last call answers inside its reserve.
            out_of_money = not last_call and not model.useful_call_fits(self.history)
            try:
                completion = model.complete(self.history, last_call=last_call or out_of_money,
                                            budget_spent=out_of_money)
            except NoUsefulCall:  # a retry that no longer fits with its tools: the answer, inside the reserve
                out_of_money = True
                completion = model.complete(self.history, last_call=True, budget_spent=True)
            last_call = last_call or out_of_money
            response = bound_response(completion, self.tools.call_ids)
            message = response.completion.as_message()
            overshot = self.context.spend.limited and not self.context.spend.clamp and self.context.spend.exceeded()
            if last_call or overshot:
                message.pop("tool_calls", None)
            self.add_message(message)
            if out_of_money:
                raise TurnEnded(Ending.budget_answered(model.spent_words(), model.kept_words()))
            if overshot:  # safeguards off: the budget is only looked at after each call, as others do
                raise TurnEnded(Ending.budget_overshot(model.spent_words(), model.overshoot_words(),
                                                       answered=not response.calls))
            if last_call or not response.calls:
                return  # the answer goes out with the ending, in one write: a tab sees both at once
            self.context.publishing.publish(self.context.writer)
            self.tools.run_all(response.calls)
        raise TurnEnded(Ending.step_limit(self.context.config.max_steps))

    def add_message(self, message: Message) -> None:
        self.history.append(message)
        self.context.writer.add_message(message)

    def finish(self, ending: Ending) -> bool:
        """The final write: the ending's words in the chat, and done. False when it was refused."""
        if ending.message:
            self.add_message({"role": Role.ASSISTANT, "content": ending.message})
        return self.context.writer.write_ending(ending, self.context.budget.job_timeout_at)
