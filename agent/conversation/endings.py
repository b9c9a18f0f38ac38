"""How a turn ends: one `Ending` value, each one built by a named constructor, so that one ending
has one wording wherever it is written.

The job writes its own ending (agent/turn/: its raise sites raise `TurnEnded(Ending....)`, and
exits.py maps what stopped the loop to an Ending). When the job cannot (killed, lost, stopped
before it started), the failure callback or a front end writes it through `write_ending`. Every
ending writes `done: true` with its message in the chat; the store refuses a second ending, so
whoever is first wins. A new ending kind is a member of ErrorKind (agent/contract.py), one
constructor here, and its raise site.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agent import tracing
from agent.contract import Error, ErrorKind, ProviderErrorKind, Role, Status, carried, turn_summary
from agent.conversation import daily
from agent.conversation.errors import StoreError
from agent.conversation.store import Store
from agent.prices import PUSD_PER_USD

# The one wording of an empty reply, in the ending and in its step (the page, the CLI and the export show them).
EMPTY_REPLY = "The model sent an empty reply"


@dataclass(frozen=True)
class Ending:
    """How a turn ended: its status, and (for any ending but an answer) its error's kind and the
    message a person reads in the chat."""

    status: Status
    kind: str = ""  # an ErrorKind or a ProviderErrorKind; "" for an answer
    message: str = ""  # "" for an answer: the answer itself is the last message

    @property
    def error(self) -> Error | None:
        """The state's `error` field for this ending."""
        return None if self.status == Status.DONE else Error(kind=self.kind, message=self.message)

    # -- an answer -----------------------------------------------------------------------------

    @classmethod
    def answered(cls) -> Ending:
        return cls(Status.DONE)

    # -- stopped at the user's request ---------------------------------------------------------

    @classmethod
    def cancelled(cls, while_doing: str = "") -> Ending:
        """Stopped at the user's request; `while_doing` says what the stop cut ("while ...")."""
        return cls(Status.CANCELLED, ErrorKind.CANCELLED, f"Stopped at your request{while_doing}.")

    @classmethod
    def cancelled_before_start(cls) -> Ending:
        return cls.cancelled(", before a worker started it")

    @classmethod
    def cancelled_in_tool(cls, tool: str, ran_s: float) -> Ending:
        # Says what the tool's own result says: it was cut, not finished.
        return cls.cancelled(f", while the {tool} tool was running: it was cut short after {ran_s:.1f} s")

    @classmethod
    def cancelled_in_call(cls, into_call_s: float, arrived_chars: int) -> Ending:
        """What a stop cut, named as it was: the reply being written, or the wait for it to begin."""
        if arrived_chars:
            return cls.cancelled(f", while the model was writing its reply ({arrived_chars:,} characters "
                                 f"written, {into_call_s:.1f} s into the call)")
        return cls.cancelled(f", while waiting for the model's reply ({into_call_s:.1f} s into the call)")

    @classmethod
    def cancelled_awaiting_approval(cls, tool: str) -> Ending:
        return cls.cancelled(f", while the {tool} tool waited for your approval: it was not run")

    @classmethod
    def cancelled_in_retry_wait(cls, wait_s: float) -> Ending:
        return cls.cancelled(f", while waiting {wait_s:.1f} s before trying the model call again")

    # -- the turn's own limits -----------------------------------------------------------------

    @classmethod
    def step_limit(cls, max_steps: int) -> Ending:
        return cls(Status.FAILED, ErrorKind.STEP_LIMIT,
                   f"I stopped after {max_steps} model round-trips (the step limit) without a final answer.")

    @classmethod
    def recorded_steps_limit(cls, recorded: int) -> Ending:
        return cls(Status.FAILED, ErrorKind.STEP_LIMIT,
                   f"I stopped after {recorded} steps, the most one turn may record, without a final answer.")

    @classmethod
    def deadline(cls, remaining_s: float, min_call_s: float) -> Ending:
        return cls(Status.TIMED_OUT, ErrorKind.DEADLINE,
                   f"I ran out of time: {remaining_s:.1f} s were left before the deadline, and a model call "
                   f"needs at least {min_call_s:g} s, so I stopped here.")

    # -- the fourth clock: the turn's budget (agent/spend.py) -------------------------------------

    @classmethod
    def budget_answered(cls, spent: str, kept: str) -> Ending:
        """No useful call fitted the budget: the last call answered without tools, inside the reserve."""
        return cls(Status.DONE, ErrorKind.BUDGET,
                   f"The budget for this turn is spent, so I answered with what I had: it spent {spent}; {kept}.")

    @classmethod
    def budget_spent(cls, spent: str, left: str) -> Ending:
        """Not even an answer fitted what was left: no call was started."""
        return cls(Status.FAILED, ErrorKind.BUDGET,
                   f"The budget for this turn is spent: it spent {spent}, and the {left} left cannot pay for an "
                   "answer, so I stopped here without calling the model again.")

    @classmethod
    def budget_overshot(cls, spent: str, over: str, *, answered: bool) -> Ending:
        """Safeguards off: the budget was only checked after each call, and the last one went past it."""
        status = Status.DONE if answered else Status.FAILED
        return cls(status, ErrorKind.BUDGET,
                   f"The budget was only checked after each call (safeguards off), and this turn overshot it: it "
                   f"spent {spent}, {over}.")

    # -- the model ------------------------------------------------------------------------------

    @classmethod
    def no_provider(cls, kind: str, problem: str) -> Ending:
        """The provider could not be set up (a server the key may not go to, a bad key)."""
        return cls(Status.FAILED, kind, f"I could not call the model: {problem}.")

    @classmethod
    def call_failed(cls, kind: str, problem: str, *, no_time_to_retry: bool = False) -> Ending:
        """A model call failed for good; one that timed out ran the turn out of time."""
        status = Status.TIMED_OUT if kind == ProviderErrorKind.TIMEOUT else Status.FAILED
        if no_time_to_retry:
            return cls(status, kind, f"The model call failed ({problem}) and no time is left to retry.")
        return cls(status, kind, f"The model call failed: {problem}.")

    @classmethod
    def rate_limited(cls, wait_s: float, remaining_s: float) -> Ending:
        return cls(Status.FAILED, ProviderErrorKind.RATE_LIMITED,
                   f"The provider is rate-limiting: it asked to wait {wait_s:g} s, which does not fit in the "
                   f"{remaining_s:.1f} s left before the deadline. Try again in a moment.")

    @classmethod
    def retries_exhausted(cls, attempts: int) -> Ending:
        return cls(Status.FAILED, ErrorKind.RETRIES, f"The model call failed {attempts} times in a row.")

    @classmethod
    def empty_reply(cls, lack: str, *, asked_twice: bool = False, not_asked_again_for: str = "") -> Ending:
        """No text and no tool call (`lack` says which); asked again without streaming (`asked_twice`),
        or not asked again for lack of `not_asked_again_for` ("attempt", "time")."""
        again = ", streamed and again without streaming" if asked_twice else ""
        why = f" (no {not_asked_again_for} was left to ask again without streaming)" if not_asked_again_for else ""
        return cls(Status.FAILED, ErrorKind.EMPTY_REPLY, f"{EMPTY_REPLY}{again}: {lack}, so there is no answer to "
                                                         f"show{why}.")

    # -- the job and its worker -----------------------------------------------------------------

    @classmethod
    def job_timeout(cls, job_timeout_s: float | None) -> Ending:
        return cls(Status.TIMED_OUT, ErrorKind.JOB_TIMEOUT,
                   f"The queue's job timeout ({job_timeout_s} s) stopped this turn before it could finish.")

    @classmethod
    def app_stopped(cls, why: str) -> Ending:
        """The app (its workers) was stopped while the turn ran, and the turn could not be handed over to the
        app's next start (agent/turn/shutdown.py): not a person's Stop."""
        return cls(Status.FAILED, ErrorKind.SHUTDOWN,
                   f"The app was stopped while this reply was being written, and the reply could not go on after "
                   f"it: {why}. You can send your message again.")

    @classmethod
    def internal(cls, error_name: str) -> Ending:
        return cls(Status.FAILED, ErrorKind.INTERNAL, f"Something went wrong inside the agent ({error_name}).")

    @classmethod
    def worker_failed(cls, error_name: str) -> Ending:
        return cls(Status.FAILED, ErrorKind.WORKER, f"The worker failed while writing this reply ({error_name}).")

    @classmethod
    def worker_lost(cls, reason: str) -> Ending:
        return cls(Status.FAILED, ErrorKind.WORKER_LOST,
                   f"The worker was lost ({reason}), so this reply could not be finished. "
                   "Nothing is running for it any more: you can send your message again.")

    @classmethod
    def worker_lost_no_time(cls, reason: str, remaining_s: float, min_call_s: float) -> Ending:
        return cls(Status.FAILED, ErrorKind.WORKER_LOST,
                   f"The worker was lost ({reason}) and no time remained to resume this reply on another: "
                   f"{max(0.0, remaining_s):.1f} s were left before the deadline, and a model call needs at least "
                   f"{min_call_s:g} s. You can send your message again.")

    @classmethod
    def worker_lost_no_resume(cls, reason: str, resumes: int) -> Ending:
        times = "once" if resumes == 1 else f"{resumes} times"
        return cls(Status.FAILED, ErrorKind.WORKER_LOST,
                   f"The worker was lost ({reason}) after this reply had been resumed {times}, the most a turn "
                   f"may be (AGENT_MAX_RESUMES). You can send your message again." if resumes else
                   f"The worker was lost ({reason}), and resuming on another worker is off (AGENT_MAX_RESUMES=0), "
                   "so this reply could not be finished. You can send your message again.")

    @classmethod
    def not_queued(cls, problem: str) -> Ending:
        """The turn was accepted, but its job could not be put on the queue: it never runs."""
        return cls(Status.FAILED, ErrorKind.NOT_QUEUED,
                   f"This message could not be put on the queue, so no worker will answer it: {problem}. "
                   "Send it again once that is solved.")

    @classmethod
    def queue_expired(cls, reason: str) -> Ending:
        return cls(Status.FAILED, ErrorKind.QUEUE_EXPIRED,
                   f"No worker was free to start this reply: {reason}, so it was dropped without running. "
                   "Send your message again when the queue is shorter.")


def write_ending(
    store: Store,
    conversation_id: str,
    turn_id: str,
    ending: Ending,
    *,
    started_at: float | None = None,
    job_timeout_at: float | None = None,
    writer: str = "",
) -> bool:
    """End a turn from outside its job (failure callback, lost worker, stop). False if already ended.

    `writer`: the job this ending is about; refused when the turn was handed to another job meanwhile
    ("" ends the turn whichever job runs it: a stop)."""
    state = store.read_meta(conversation_id)
    if state is None or state["turn_id"] != turn_id or state["done"]:
        return False
    doc = carried(state)
    doc["started_at"] = doc["started_at"] or started_at
    doc["job_timeout_at"] = doc["job_timeout_at"] or job_timeout_at
    now = time.time()
    doc.update(status=ending.status, error=ending.error, current_step=None, ended_at=now)
    doc["spend"] = charged_in_flight(doc.get("spend"))
    try:
        store.publish(
            conversation_id,
            turn_id,
            doc,
            done=True,
            new_messages=[{"role": Role.ASSISTANT, "content": ending.message}],
            summary=turn_summary(turn_id, doc, now),
            writer=writer,
        )
    except StoreError:
        return False
    daily.settle(store.redis, (doc.get("config") or {}).get("daily"), turn_id, daily.spent_of(doc["spend"]))
    tracing.turn_ended(store, conversation_id, turn_id)
    return True


def charged_in_flight(spend: dict | None) -> dict | None:
    """A turn ended from outside its job: the call it had in flight counts as spent, at its worst case."""
    if not spend or not spend.get("in_flight_tokens"):
        return spend
    usd = spend.get("pusd")
    charged = {**spend, "tokens": (spend.get("tokens") or 0) + spend["in_flight_tokens"], "in_flight_tokens": 0,
               "in_flight_pusd": 0}
    if usd is not None:
        charged["pusd"] = usd + (spend.get("in_flight_pusd") or 0)
        charged["usd"] = charged["pusd"] / PUSD_PER_USD
    return charged
