"""The job's entry points: `run_turn` (what a worker runs) and `on_failure` (RQ's failure callback).

Arguments are ids, never content or keys: the job reads its turn, and the settings stored with
it, from the state.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from dataclasses import replace

import redis
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from agent import job_alarm
from agent.contract import Message, Role, State, Status, carried
from agent.conversation.endings import Ending, write_ending
from agent.conversation.store import Store
from agent.queue import JOB_FUNCTION, get_queue
from agent.runtime.connection import state_client
from agent.settings import TurnConfig, least_state_ttl_s, state_ttl_from_env
from agent.tools import acting_for
from agent.turn import heartbeat, shutdown
from agent.turn.continuations import MARK as CONTINUATION_MARK
from agent.turn.loop import Turn
from agent.turn.resume import Resumption, began, resume_or_end
from agent.turn.tool_runs import answer_every_call

log = logging.getLogger(__name__)

MODEL_FIELDS = ("role", "content", "tool_calls", "tool_call_id")  # what a provider is sent of a stored message

_clients: dict[str, redis.Redis] = {}


def _store() -> Store:
    url = os.environ["REDIS_URL"]
    if url not in _clients:
        _clients[url] = state_client(url)
    return Store(_clients[url], state_ttl_from_env())


def _job_started_at() -> tuple[float, str]:
    job = get_current_job()
    if job is None:
        return time.time(), ""
    started = job.started_at.timestamp() if job.started_at else time.time()
    # RQ stamps started_at just before it arms the timeout: our deadline counts from there.
    return min(started, time.time()), job.id


def run_turn(conversation_id: str, turn_id: str) -> str:
    """The job function (the only one a worker runs)."""
    with job_alarm.watching():
        return contextvars.copy_context().run(_run, conversation_id, turn_id)  # what it sets ends with it


def _run(conversation_id: str, turn_id: str) -> str:
    store = _store()
    started_at, job_id = _job_started_at()
    state = store.read(conversation_id, tip=turn_id)  # the path to this turn: never another branch
    if state is None:
        log.warning("turn %s: conversation %s is gone (expired?)", turn_id, conversation_id)
        return "gone"
    if state["turn_id"] != turn_id or state["done"]:
        return "stale"
    acting_for.set_person(state["owner"])  # whose turn its tools run in: the state says, never the model
    config = TurnConfig.from_dict(state["config"] or {})
    # The page may give a turn a longer job timeout than the one AGENT_STATE_TTL was checked against:
    # its conversation must still outlive the longest wait for its next write (see settings.state_ttl_s).
    store.ttl_s = max(store.ttl_s, least_state_ttl_s(config))
    job_id = job_id or state["job_id"] or turn_id  # run outside a worker: as the job the state names
    if state["job_id"] and state["job_id"] != job_id:
        # Another job owns the turn now (a continuation, a resume, a re-queue): this one was enqueued for it
        # earlier and runs late. It must not start it, nor enter the index of running turns, whose lapsed lease
        # would then make a watch take the turn's real job for lost.
        log.info("turn %s is owned by job %s, not %s: nothing to do", turn_id, state["job_id"], job_id)
        return "duplicate" if CONTINUATION_MARK in job_id else "not its job"
    # The claim: once per job, only while it owns the turn (atomic with that check, so a job the turn was
    # handed away from can never start it), and the turn watched from that same instant (claim.lua).
    claimed = store.flags.claim(conversation_id, turn_id, job_id, ttl_s=config.job_timeout_s * 2 + 60,
                                alive_ms=heartbeat.ALIVE_MS)
    if claimed != "ok":
        log.info("turn %s: job %s does not run it (%s)", turn_id, job_id, claimed)
        return "duplicate" if claimed == "duplicate" else "stale" if claimed == "ended" else claimed
    with heartbeat.beating(store, conversation_id, turn_id, job_id):
        if began(state):  # handed over after its first write: it goes on inside the turn's clocks
            return _resume(store, conversation_id, state, config, job_id)
        # Not begun: a fresh turn, or the continuation after an answer; on clocks from this job's start. One
        # queued again (its job was lost before it began) says so in a resume step.
        after_answer = _after_answer(state)
        resumption = None
        if after_answer or state["attempt"] > 0:
            resumption = replace(Resumption.of(state, store.live_seq(conversation_id)), after_answer=after_answer,
                                 requeued=job_id != _answer_job(state) if after_answer else True)
        history = (_taken_over_history(state, resumption) if resumption is not None
                   else answer_every_call([_for_model(m) for m in state["history"]]))
        turn = Turn.create(store, conversation_id, turn_id, config, started_at=started_at, history=history,
                           doc=carried(state), persisted_len=len(state["history"]), writer=job_id,
                           resumption=resumption, turn_start=turn_start(state))
        return turn.run()


def _resume(store: Store, conversation_id: str, state: State, config: TurnConfig, job_id: str) -> str:
    """Continue a turn whose worker was lost (resume.py), from its state as last published, on its own clocks."""
    turn_id, now = state["turn_id"], time.time()
    remaining = (state["deadline_at"] or now) - now
    if remaining < config.min_call_s:  # it waited too long for a worker
        ending = Ending.worker_lost_no_time("its resumed job waited for a free worker", remaining, config.min_call_s)
        if shutdown.stopped_with_the_app(job_id):
            ending = Ending.app_stopped(f"no worker started again before its deadline ({max(0.0, remaining):.1f} s "
                                        f"were left, and a model call needs at least {config.min_call_s:g} s)")
        write_ending(store, conversation_id, turn_id, ending, writer=job_id)
        return "no time"
    resumption = Resumption.of(state, store.live_seq(conversation_id))
    turn = Turn.create(store, conversation_id, turn_id, config, started_at=state["started_at"],
                       history=_taken_over_history(state, resumption), doc=carried(state),
                       persisted_len=len(state["history"]), writer=job_id, resumption=resumption,
                       turn_start=turn_start(state))
    return turn.run()


def turn_start(state: State) -> int:
    """Where the turn's messages start in the history (the path to it): at its person's message, the last one."""
    history = state["history"]
    return max((i for i, m in enumerate(history) if m.get("role") == Role.USER), default=0)


def _after_answer(state: State) -> bool:
    """The turn waits for the continuation a person's answer to its request for approval enqueued."""
    approval = state["approval"]
    return bool(approval and approval.get("answer") and state["status"] == Status.QUEUED and not began(state))


def _answer_job(state: State) -> str:
    """The continuation the answer enqueued (a job queued again in its place has another id)."""
    return (state["approval"] or {}).get("job_id") or ""


def _taken_over_history(state: State, resumption: Resumption) -> list[Message]:
    """What the model sees of a turn taken over: the last response's calls without a result get theirs
    from the new job (run, run again, or not); any earlier one is answered as never run."""
    history = [_for_model(m) for m in state["history"]]
    last = max((i for i, m in enumerate(history) if m.get("role") == Role.ASSISTANT), default=len(history))
    return answer_every_call(history[:last]) + history[last:] if resumption.pending else answer_every_call(history)


def _for_model(message: Message) -> Message:
    return {k: v for k, v in message.items() if k in MODEL_FIELDS}


def on_failure(job, connection, exc_type, exc_value, tb) -> None:
    """RQ's failure callback: the safety net that writes the ending when the job itself could not."""
    if job.func_name != JOB_FUNCTION or len(job.args) != 2:
        return
    conversation_id, turn_id = job.args
    store = _store()
    if exc_type is not None and issubclass(exc_type, JobTimeoutException):
        ending = Ending.job_timeout(job.timeout)
    else:
        name = getattr(exc_type, "__name__", "error")
        state = store.read_meta(conversation_id)
        if state is not None and state["turn_id"] == turn_id and not state["done"] and state["job_id"] == job.id:
            # The worker failed under the turn (begun, or not yet: then it is queued again): it goes on on
            # another worker while it can.
            resume_or_end(store, get_queue(connection), conversation_id, state, job.id, f"its job failed: {name}")
            return
        ending = Ending.worker_failed(name)
    # A job that wrote nothing itself (safeguards off) still ran: RQ knows when, and its timeout.
    started_at = job.started_at.timestamp() if job.started_at else None
    job_timeout_at = started_at + job.timeout if started_at is not None and job.timeout else None
    write_ending(store, conversation_id, turn_id, ending, started_at=started_at, job_timeout_at=job_timeout_at,
                 writer=job.id)
