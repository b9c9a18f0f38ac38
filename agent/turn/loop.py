"""The turn loop: model call -> tool runs -> model call ..., at most max_steps round-trips.

However the loop ends (answer, step limit, deadline, provider error, stop request, the queue's
own timeout, a shutdown), the ending is written with done=true and the reason in the chat; see
exits.py for the table. What "safeguards off" changes comes in as two policies (policies.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from agent import tracing
from agent.contract import Error, ErrorKind, Message, Role, Status, TurnDoc
from agent.deadline import Clock
from agent.providers import make_provider
from agent.providers.base import ProviderError
from agent.settings import TurnConfig
from agent.store import Store
from agent.turn.exits import ANSWERED, Exit, TurnEnded, exit_for
from agent.turn.model_calls import ModelCalls
from agent.turn.policies import Clocks, Publishing, policies_for
from agent.turn.response_limits import bound_response
from agent.turn.stop_watch import StopRequests
from agent.turn.tool_runs import ToolRuns
from agent.turn.writer import StateWriter

log = logging.getLogger(__name__)

MAX_RECORDED_STEPS = 400  # steps one turn may record; a round already started may add one round's worth


@dataclass
class Turn:
    """One turn: its clocks and publishing policies, its writer, and what the model sees."""

    config: TurnConfig
    budget: Clocks
    publishing: Publishing
    writer: StateWriter
    stops: StopRequests
    history: list[Message]  # what the model sees
    tools: ToolRuns = field(init=False)

    def __post_init__(self) -> None:
        self.tools = ToolRuns(self.budget, self.publishing, self.writer, self.stops, self.history, self.config.tools)

    @classmethod
    def create(cls, store: Store, conversation_id: str, turn_id: str, config: TurnConfig, *, started_at: float,
               history: list[Message], doc: TurnDoc, persisted_len: int, clock: Clock = time.time) -> Turn:
        """A turn with the clocks and publishing its settings ask for."""
        budget, publishing = policies_for(config, started_at, clock)
        writer = StateWriter(store, conversation_id, turn_id, doc, persisted_len, budget.now)
        return cls(config, budget, publishing, writer, StopRequests(store, turn_id), history)

    def run(self) -> str:
        """Run the turn and write its ending; the queue's timeout and a shutdown are raised again after it."""
        try:
            model = self.start()
            with self.stops.watching():
                self.loop(model)
            leaving = Exit(ANSWERED)
        except BaseException as exc:  # noqa: BLE001 - every way out is in the one table (exits.py)
            leaving = exit_for(exc, self.writer.turn_id, self.config.job_timeout_s)
            if leaving is None:
                raise
        if leaving.ending is None:
            log.info("turn %s was ended elsewhere; this job stops without writing", self.writer.turn_id)
            return "closed"
        if leaving.reraise is None or self.publishing.writes_ending_when_killed:
            self.finish(leaving.ending)
            tracing.turn_ended(self.writer.store, self.writer.conversation_id, self.writer.turn_id)
        if leaving.reraise is not None:
            raise leaving.reraise
        return leaving.ending.status

    def start(self) -> ModelCalls:
        self.writer.doc.update(status=Status.RUNNING, started_at=self.budget.started_at,
                               deadline_at=self.budget.deadline_at, job_timeout_at=self.budget.job_timeout_at)
        self.publishing.publish(self.writer)
        try:
            provider = make_provider(self.config)
        except ProviderError as exc:  # a server the key may not go to, a bad key: the turn ends in words
            raise TurnEnded(Status.FAILED, exc.kind, f"I could not call the model: {exc.message}.") from None
        return ModelCalls(self.config, self.budget, self.publishing, self.writer, self.stops, provider)

    def loop(self, model: ModelCalls) -> None:
        for _ in range(self.config.max_steps):
            self.stops.check()
            if self.writer.step_index >= MAX_RECORDED_STEPS:
                raise TurnEnded(Status.FAILED, ErrorKind.STEP_LIMIT, f"I stopped after {self.writer.step_index} "
                                "steps, the most one turn may record, without a final answer.")
            last_call = self.tools.used and self.budget.only_one_call_left()
            response = bound_response(model.complete(self.history, last_call=last_call))
            message = response.completion.as_message()
            if last_call:
                message.pop("tool_calls", None)
            self.add_message(message)
            if last_call or not response.calls:
                return  # the answer goes out with the ending, in one write: a tab sees both at once
            self.publishing.publish(self.writer)
            self.tools.run_all(response.calls)
        raise TurnEnded(Status.FAILED, ErrorKind.STEP_LIMIT, f"I stopped after {self.config.max_steps} model "
                        "round-trips (the step limit) without a final answer.")

    def add_message(self, message: Message) -> None:
        self.history.append(message)
        self.writer.add_message(message)

    def finish(self, ending: TurnEnded) -> None:
        """The final write: the ending's words in the chat, and done."""
        if ending.message:
            self.add_message({"role": Role.ASSISTANT, "content": ending.message})
        error = None if ending.status == Status.DONE else Error(kind=ending.kind, message=ending.message)
        self.writer.write_ending(ending.status, error, self.budget.job_timeout_at)
