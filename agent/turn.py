"""The RQ job: one chat turn under the three clocks, publishing the state as it goes.

Model call -> tool runs -> model call ..., at most max_steps round-trips. After every model
response and every tool result the state is written with done=false; however the loop ends
(answer, step limit, deadline, provider error, stop request, the queue's own timeout, a
shutdown), a finally path writes done=true with the reason in the chat.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import redis
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from agent import job_alarm
from agent import tools as tool_registry
from agent.deadline import Budget, CallTimeout, retry_wait_s
from agent.endings import turn_summary, write_ending
from agent.providers import make_provider
from agent.providers.base import Completion, ProviderError
from agent.queue import JOB_FUNCTION
from agent.response_limits import PlannedCall, bound_response
from agent.runtime.connection import STATE_RETRIES, STATE_SOCKET_TIMEOUT_S, redis_problem, state_client
from agent.settings import DEFAULT_STATE_TTL_S, TurnConfig
from agent.stop_watch import StopWatch
from agent.store import Store, StoreError

log = logging.getLogger(__name__)

MAX_ATTEMPTS_PER_CALL = 5  # one model round-trip: the first try and up to four retries
FINAL_WRITE_RESERVE_S = 1.0  # seconds before the job timeout when final-write retries give up
WORST_STATE_WRITE_S = STATE_SOCKET_TIMEOUT_S * (STATE_RETRIES + 1)  # one write against a stalled Redis
CANCEL_CHECK_S = 0.25  # seconds between stop-flag checks while sleeping
NAIVE_TIMEOUT_S = 3600.0  # seconds: what "safeguards off" gives a call or tool (no real bound)
MAX_RECORDED_STEPS = 400  # steps one turn may record; a round already started may add one round's worth
EAGER_PUBLISHED_TOOLS = 4  # the first tools of a response are published one by one, as they land
PUBLISH_INTERVAL_S = 0.25  # seconds: after those, tool results are written at most this often
NOT_RUN_RESULT = "Error: not run: the turn's deadline came before this tool could start"
LAST_CALL_NUDGE = (
    "Time is nearly up for this turn. Answer now, briefly, with what you already have. "
    "Do not call any tools."
)

_clients: dict[str, redis.Redis] = {}


def _store() -> Store:
    url = os.environ["REDIS_URL"]
    if url not in _clients:
        _clients[url] = state_client(url)
    try:
        ttl_s = max(1, int(os.environ.get("AGENT_STATE_TTL") or DEFAULT_STATE_TTL_S))
    except ValueError:  # the process that started this worker refused it already; never crash a job on it
        ttl_s = DEFAULT_STATE_TTL_S
    return Store(_clients[url], ttl_s)


class TurnEnded(Exception):
    """The loop stops here; `status` and `message` become the ending."""

    def __init__(self, status: str, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


class TurnClosed(Exception):
    """Someone else already ended this turn (the page, a stop, a failure callback)."""


@dataclass
class Turn:
    store: Store
    conversation_id: str
    turn_id: str
    job_id: str
    config: TurnConfig
    budget: Budget
    history: list[dict]
    doc: dict
    persisted_len: int = 0
    pending_messages: list[dict] = field(default_factory=list)
    pending_steps: list[dict] = field(default_factory=list)
    step_index: int = 0
    used_tools: bool = False
    unconfirmed: list[tuple[int, int]] = field(default_factory=list)  # (messages, steps) of failed writes
    provider: object = None
    last_write_at: float = 0.0  # budget clock time of the last write that landed
    stop: threading.Event = field(default_factory=threading.Event)  # set once a stop request is seen

    # -- writing ---------------------------------------------------------------------------

    def flush(self, *, done: bool = False, summary: dict | None = None, reconciled: bool = False) -> None:
        """Write what is pending. A Redis hiccup mid-turn keeps it pending for the next write."""
        try:
            self.store.publish(
                self.conversation_id,
                self.turn_id,
                self.doc,
                done=done,
                new_messages=self.pending_messages,
                new_steps=self.pending_steps,
                expected_history_len=self.persisted_len,
                summary=summary,
            )
        except StoreError as exc:
            if exc.reason == "CONFLICT" and not reconciled and self.landed_already():
                self.flush(done=done, summary=summary, reconciled=True)
                return
            raise TurnClosed(str(exc)) from exc
        except redis.RedisError as exc:
            # It may still land (a timed-out write that Redis runs later): remember what it held.
            self.unconfirmed.append((len(self.pending_messages), len(self.pending_steps)))
            if done:
                raise
            log.warning("turn %s: state write failed, kept for the next write: %s", self.turn_id, redis_problem(exc))
            return
        self.persisted_len += len(self.pending_messages)
        self.pending_messages = []
        self.pending_steps = []
        self.unconfirmed = []
        self.last_write_at = self.budget.now()

    def landed_already(self) -> bool:
        """True when the history "moved" only by our own pending messages.

        A write that timed out (Redis paused past the socket timeout) may still run once Redis
        resumes; the client's retry of it, or the next write, then finds the history longer than
        expected. Only this job appends to its turn's history, so if the new tail is our own
        pending messages, that write landed: count it as written instead of giving up the turn."""
        try:
            landed = self.store.history_since(self.conversation_id, self.persisted_len)
        except redis.RedisError:
            return False
        if not landed or landed != json.loads(json.dumps(self.pending_messages[: len(landed)])):
            return False
        log.warning("turn %s: a write that timed out had landed; carrying on", self.turn_id)
        # The batch that landed is one of the failed attempts: its steps landed with its messages.
        steps_landed = next((n_steps for n_messages, n_steps in self.unconfirmed if n_messages == len(landed)), 0)
        self.pending_steps = self.pending_steps[steps_landed:]
        self.unconfirmed = []
        self.persisted_len += len(landed)
        self.pending_messages = self.pending_messages[len(landed):]
        return True

    def add_message(self, message: dict) -> None:
        self.history.append(message)
        self.pending_messages.append(message)

    def add_step(self, kind: str, name: str, started_at: float, outcome: str, **extra) -> dict:
        self.step_index += 1
        step = {
            "turn_id": self.turn_id,
            "index": self.step_index,
            "kind": kind,
            "name": name,
            "started_at": started_at,
            "ended_at": self.budget.now(),
            "timeout_s": extra.pop("timeout_s", None),
            "remaining_s": extra.pop("remaining_s", None),
            "outcome": outcome,
            **extra,
        }
        step["duration_s"] = round(step["ended_at"] - started_at, 3)
        self.pending_steps.append(step)
        return step

    def set_current(self, kind: str | None, name: str = "", timeout_s: float | None = None) -> None:
        current = {"kind": kind, "name": name, "started_at": self.budget.now(), "timeout_s": timeout_s}
        self.doc["current_step"] = None if kind is None else current

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> str:
        ending: TurnEnded | None = None
        reraise: BaseException | None = None
        try:
            self.doc.update(status="running", started_at=self.budget.started_at)
            if self.config.safeguards:
                self.doc.update(deadline_at=self.budget.deadline_at, job_timeout_at=self.budget.job_timeout_at)
                self.flush()
            else:
                self.doc.update(deadline_at=None, job_timeout_at=self.budget.job_timeout_at)
            self.provider = self.make_provider()
            with StopWatch(self.stop_requested) as watch:
                self.stop = watch.event
                self.loop()
            ending = TurnEnded("done", "", "")
        except TurnEnded as exc:
            ending = exc
            if job_alarm.fired():  # the job timeout, caught on the way and turned into another ending
                ending, reraise = self.job_timeout_ending(), JobTimeoutException("the queue's job timeout fired")
        except TurnClosed:
            log.info("turn %s was ended elsewhere; this job stops without writing", self.turn_id)
            return "closed"
        except JobTimeoutException as exc:
            # Never swallowed: it is recorded, and re-raised so RQ marks the job failed.
            ending, reraise = self.job_timeout_ending(), exc
        except (SystemExit, KeyboardInterrupt) as exc:
            ending = TurnEnded("cancelled", "shutdown", "The worker shut down while writing this reply.")
            reraise = exc
        except Exception as exc:  # noqa: BLE001 - the turn must end with a readable message
            if job_alarm.fired():  # the job timeout, caught on the way and turned into another error
                ending, reraise = self.job_timeout_ending(), JobTimeoutException("the queue's job timeout fired")
            else:
                log.exception("turn %s failed", self.turn_id)
                ending = TurnEnded("failed", "internal",
                                   f"Something went wrong inside the agent ({type(exc).__name__}).")
        finally:
            # "Safeguards off" is the naive loop: killed by the queue, it writes nothing itself.
            if ending is not None and (self.config.safeguards or reraise is None):
                self.finish(ending)
        if reraise is not None:
            raise reraise
        return ending.status

    def make_provider(self):
        """The turn's provider; a refusal (a server the key may not go to, a bad key) ends the turn in words."""
        try:
            return make_provider(self.config)
        except ProviderError as exc:
            raise TurnEnded("failed", exc.kind, f"I could not call the model: {exc.message}.") from None

    def job_timeout_ending(self) -> TurnEnded:
        return TurnEnded(
            "timed_out",
            "job_timeout",
            f"The queue's job timeout ({self.config.job_timeout_s} s) stopped this turn before it finished.",
        )

    def loop(self) -> None:
        for _ in range(self.config.max_steps):
            self.check_cancel()
            if self.step_index >= MAX_RECORDED_STEPS:
                raise TurnEnded(
                    "failed",
                    "step_limit",
                    f"I stopped after {self.step_index} steps, the most one turn may record, without a final answer.",
                )
            last_call = self.config.safeguards and self.used_tools and self.budget.only_one_call_left()
            response = bound_response(self.call_model(last_call=last_call))
            message = response.completion.as_message()
            if last_call:
                message.pop("tool_calls", None)
            self.add_message(message)
            if last_call or not response.calls:
                return  # the answer goes out with the ending, in one write: a tab sees both at once
            if self.config.safeguards:
                self.flush()
            self.run_tools(response.calls)
        raise TurnEnded(
            "failed",
            "step_limit",
            f"I stopped after {self.config.max_steps} model round-trips (the step limit) without a final answer.",
        )

    def stop_requested(self) -> bool:
        """The cooperative flag the page and the CLI set (called from the stop watch's thread too)."""
        return self.store.cancel_requested(self.turn_id)

    def check_cancel(self) -> None:
        job_alarm.raise_if_fired()  # between steps: a job timeout some handler caught is raised again
        if not self.stop.is_set():
            try:
                if not self.stop_requested():
                    return
            except redis.RedisError:
                return
        raise TurnEnded("cancelled", "cancelled", "Stopped at your request.")

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.stop.wait(min(CANCEL_CHECK_S, left))
            self.check_cancel()

    def call_timeout(self) -> CallTimeout | None:
        if not self.config.safeguards:
            return CallTimeout(total_s=NAIVE_TIMEOUT_S, connect_s=self.config.connect_timeout_s)
        return self.budget.call_timeout()

    def call_model(self, *, last_call: bool) -> Completion:
        tools = [] if last_call else tool_registry.schemas(self.config.tools)
        messages = self.history + ([{"role": "system", "content": LAST_CALL_NUDGE}] if last_call else [])
        name = f"{self.config.provider}:{self.config.model}" if self.config.provider != "demo" else self.config.model
        for attempt in range(1, MAX_ATTEMPTS_PER_CALL + 1):
            remaining = self.budget.remaining_s()
            timeout = self.call_timeout()
            if timeout is None:
                self.add_step("skip", name, self.budget.now(), "skipped", remaining_s=round(remaining, 3),
                              detail=f"{remaining:.1f} s left, below the {self.config.min_call_s:g} s minimum")
                log.info("turn %s: model call skipped: %.1f s left < %g s minimum",
                         self.turn_id, remaining, self.config.min_call_s)
                raise TurnEnded(
                    "timed_out",
                    "deadline",
                    f"I ran out of time: {remaining:.1f} s were left before the deadline, and a model call "
                    f"needs at least {self.config.min_call_s:g} s, so I stopped here.",
                )
            started = self.budget.now()
            self.set_current("model", name, timeout.total_s)
            if self.config.safeguards:
                self.flush()
            try:
                completion = self.provider.complete(messages, tools, timeout, stop=self.stop)
            except ProviderError as exc:
                self.set_current(None)
                if exc.kind == "stopped":
                    self.add_step("model", name, started, "stopped", timeout_s=round(timeout.total_s, 3),
                                  remaining_s=round(remaining, 3), attempt=attempt, detail=exc.message,
                                  last_call=last_call)
                    raise TurnEnded("cancelled", "cancelled", "Stopped at your request, while waiting for the "
                                    f"model's reply ({self.budget.now() - started:.1f} s into the call).") from None
                outcome = "timeout" if exc.kind == "timeout" else "error"
                self.add_step("model", name, started, outcome, timeout_s=round(timeout.total_s, 3),
                              remaining_s=round(remaining, 3), attempt=attempt, detail=exc.message,
                              last_call=last_call)
                self.retry_or_end(exc, attempt)
                continue
            self.set_current(None)
            self.add_step("model", name, started, "ok", timeout_s=round(timeout.total_s, 3),
                          remaining_s=round(remaining, 3), attempt=attempt, last_call=last_call,
                          tool_calls=len(completion.tool_calls))
            return completion
        raise TurnEnded("failed", "retries", f"The model call failed {MAX_ATTEMPTS_PER_CALL} times in a row.")

    def retry_or_end(self, exc: ProviderError, attempt: int) -> None:
        """Sleep before the next attempt when it fits in the budget; otherwise end the turn."""
        if not exc.retryable or attempt >= MAX_ATTEMPTS_PER_CALL:
            status = "timed_out" if exc.kind == "timeout" else "failed"
            raise TurnEnded(status, exc.kind, f"The model call failed: {exc.message}.")
        wait_s = retry_wait_s(attempt, exc.retry_after_s)
        if self.config.safeguards and not self.budget.wait_fits(wait_s):
            remaining = self.budget.remaining_s()
            if exc.kind == "rate_limited":
                raise TurnEnded(
                    "failed",
                    "rate_limited",
                    f"The provider is rate-limiting: it asked to wait {wait_s:g} s, which does not fit in the "
                    f"{remaining:.1f} s left before the deadline. Try again in a moment.",
                )
            status = "timed_out" if exc.kind == "timeout" else "failed"
            raise TurnEnded(status, exc.kind, f"The model call failed ({exc.message}) and no time is left to retry.")
        started = self.budget.now()
        self.set_current("retry", f"wait {wait_s:.1f} s", wait_s)
        if self.config.safeguards:
            self.flush()
        try:
            self.sleep(wait_s)
        except TurnEnded:
            self.set_current(None)
            self.add_step("retry", f"attempt {attempt + 1}", started, "stopped", timeout_s=round(wait_s, 3),
                          remaining_s=round(self.budget.remaining_s(), 3), detail="stopped at your request")
            raise
        self.set_current(None)
        self.add_step("retry", f"attempt {attempt + 1}", started, "ok", timeout_s=round(wait_s, 3),
                      remaining_s=round(self.budget.remaining_s(), 3),
                      detail=f"after {exc.kind}" + (f" (Retry-After {exc.retry_after_s:g} s)"
                                                    if exc.retry_after_s is not None else ""))

    def run_tools(self, planned: list[PlannedCall]) -> None:
        """One response's tool calls, in order. Once the deadline has passed, none is started:
        the calls left are answered in one step and the turn ends."""
        first_result = len(self.history)
        try:
            for index, item in enumerate(planned):
                self.check_cancel()
                if item.refusal is not None:
                    self.refuse_tool(item)
                elif self.config.safeguards and self.budget.remaining_s() <= 0:
                    self.skip_tools(planned[index:])
                else:
                    self.run_tool(item.call)
                if self.config.safeguards and (index < EAGER_PUBLISHED_TOOLS or index == len(planned) - 1
                                               or self.budget.now() - self.last_write_at >= PUBLISH_INTERVAL_S):
                    self.flush()
        except TurnEnded:
            # A stop between or during tools: every call still gets a result, so the history can be sent as is.
            answered = {m.get("tool_call_id") for m in self.history[first_result:]}
            for item in planned:
                if item.call.id not in answered:
                    self.add_message({"role": "tool", "tool_call_id": item.call.id, "content": UNANSWERED_CALL_RESULT})
            raise

    def run_tool(self, call) -> None:
        remaining = self.budget.remaining_s() if self.config.safeguards else NAIVE_TIMEOUT_S
        timeout_s = min(self.config.tool_timeout_cap_s, remaining) if self.config.safeguards else remaining
        started = self.budget.now()
        self.set_current("tool", call.name, timeout_s)
        result = tool_registry.run_tool(call.name, call.arguments, timeout_s=timeout_s, stop=self.stop,
                                        heartbeat=self.heartbeat, offered=self.config.tools)
        self.used_tools = True
        self.set_current(None)
        self.add_message({"role": "tool", "tool_call_id": call.id, "content": result.output})
        outcome = "stopped" if result.stopped else "ok" if result.ok else "error"
        self.add_step("tool", call.name, started, outcome, timeout_s=round(timeout_s, 3),
                      remaining_s=round(remaining, 3), arguments=call.arguments[:2000], result=result.output[:2000])
        if result.stopped:
            # Says what the tool's own result says: it was cut, not finished.
            raise TurnEnded("cancelled", "cancelled", f"Stopped at your request, while the {call.name} tool was "
                            f"running: it was cut short after {result.duration_s:.1f} s.")

    def heartbeat(self) -> None:
        """While a tool runs: publish what is pending, and that the tool is running, every so often."""
        if self.config.safeguards and self.budget.now() - self.last_write_at >= PUBLISH_INTERVAL_S:
            current = self.doc.get("current_step") or {}
            if self.pending_steps or current.get("started_at", 0) > self.last_write_at:
                self.flush()

    def refuse_tool(self, item: PlannedCall) -> None:
        """A call the response's limits refused: its error goes back to the model; nothing runs."""
        now = self.budget.now()
        self.add_message({"role": "tool", "tool_call_id": item.call.id, "content": item.refusal})
        extra = {"refused_calls": item.refused_calls} if item.refused_calls else {}
        self.add_step("tool", item.call.name, now, "refused" if item.refused_calls else "error",
                      arguments=item.call.arguments[:2000], result=item.refusal, **extra)

    def skip_tools(self, left: list[PlannedCall]) -> None:
        """The deadline has passed: answer every call left (the model needs a result for each) in one step."""
        now = self.budget.now()
        for item in left:
            self.add_message({"role": "tool", "tool_call_id": item.call.id, "content": item.refusal or NOT_RUN_RESULT})
        not_run = sum(1 for item in left if item.refusal is None)
        noun = "tool call" if not_run == 1 else "tool calls"
        self.add_step("tool", f"{not_run} {noun} not run", now, "skipped", remaining_s=0.0, not_run_calls=not_run,
                      arguments="{}", result=NOT_RUN_RESULT,
                      detail=f"the deadline came before {not_run} {noun} could start")
        log.info("turn %s: deadline passed with %d tool calls left; none started", self.turn_id, not_run)
        raise TurnEnded(
            "timed_out",
            "deadline",
            f"I ran out of time: the turn's deadline came before {not_run} of the {noun} I asked for could run, "
            "so I stopped here.",
        )

    # -- the ending ------------------------------------------------------------------------

    def finish(self, ending: TurnEnded) -> None:
        """The final write, retried briefly (within the margin) if Redis hiccups."""
        if ending.message:
            self.add_message({"role": "assistant", "content": ending.message})
        self.set_current(None)
        now = self.budget.now()
        error = None if ending.status == "done" else {"kind": ending.kind, "message": ending.message}
        self.doc.update(status=ending.status, error=error, ended_at=now)
        summary = turn_summary(self.turn_id, self.doc, now)
        give_up_at = self.budget.job_timeout_at - FINAL_WRITE_RESERVE_S
        delay = 0.1
        while True:
            try:
                self.flush(done=True, summary=summary)
                return
            except TurnClosed:
                return
            except redis.RedisError as exc:
                # A retry that could still be blocked when the queue's alarm fires is not started.
                if time.time() + delay + WORST_STATE_WRITE_S >= give_up_at:
                    # The job then ends without its ending: a front end's lost-worker check writes one
                    # as soon as Redis takes writes again (a job that finished with a running state).
                    log.error("turn %s: final write failed, leaving the ending to the front ends: %s",
                              self.turn_id, redis_problem(exc))
                    return
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


def _job_started_at() -> tuple[float, str]:
    job = get_current_job()
    if job is None:
        return time.time(), ""
    started = job.started_at.timestamp() if job.started_at else time.time()
    # RQ stamps started_at just before it arms the timeout: our deadline counts from there.
    return min(started, time.time()), job.id


def run_turn(conversation_id: str, turn_id: str) -> str:
    """The job function (the only one a worker runs). Arguments are ids, never content or keys."""
    job_alarm.watch()
    store = _store()
    started_at, job_id = _job_started_at()
    state = store.read(conversation_id)
    if state is None:
        log.warning("turn %s: conversation %s is gone (expired?)", turn_id, conversation_id)
        return "gone"
    if state["turn_id"] != turn_id or state["done"]:
        return "stale"
    config = TurnConfig.from_dict(state["config"] or {})
    if not store.claim_turn(turn_id, job_id or turn_id, ttl_s=config.job_timeout_s * 2 + 60):
        log.info("turn %s already ran (duplicate job): nothing to do", turn_id)
        return "duplicate"
    doc = {k: state[k] for k in ("status", "error", "deadline_at", "job_timeout_at", "started_at", "enqueued_at",
                                 "current_step", "config", "job_id")}
    turn = Turn(
        store=store,
        conversation_id=conversation_id,
        turn_id=turn_id,
        job_id=job_id,
        config=config,
        budget=Budget.for_turn(config, started_at),
        history=_with_every_call_answered([_for_model(m) for m in state["history"]]),
        doc=doc,
        persisted_len=len(state["history"]),
    )
    return turn.run()


UNANSWERED_CALL_RESULT = "Error: this tool call was never run: its turn ended first."


def _with_every_call_answered(history: list[dict]) -> list[dict]:
    """Providers refuse a history with a tool call that has no result (HTTP 400), and a turn
    that was killed or stopped mid-tool leaves one behind: answer it, in what the model sees."""
    answered = {m.get("tool_call_id") for m in history if m.get("role") == "tool"}
    out = []
    for message in history:
        out.append(message)
        for call in message.get("tool_calls") or []:
            if call.get("id") not in answered:
                out.append({"role": "tool", "tool_call_id": call.get("id"), "content": UNANSWERED_CALL_RESULT})
    return out


def _for_model(message: dict) -> dict:
    return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "tool_call_id")}


def on_failure(job, connection, exc_type, exc_value, tb) -> None:
    """RQ's failure callback: the safety net that writes the ending when the job itself could not."""
    if job.func_name != JOB_FUNCTION or len(job.args) != 2:
        return
    conversation_id, turn_id = job.args
    if exc_type is not None and issubclass(exc_type, JobTimeoutException):
        status, kind = "timed_out", "job_timeout"
        message = f"The queue's job timeout ({job.timeout} s) stopped this turn before it could finish."
    else:
        status, kind = "failed", "worker"
        message = f"The worker failed while writing this reply ({getattr(exc_type, '__name__', 'error')})."
    # A job that wrote nothing itself (safeguards off) still ran: RQ knows when, and its timeout.
    started_at = job.started_at.timestamp() if job.started_at else None
    job_timeout_at = started_at + job.timeout if started_at is not None and job.timeout else None
    write_ending(_store(), conversation_id, turn_id, status, kind, message,
                 started_at=started_at, job_timeout_at=job_timeout_at)
