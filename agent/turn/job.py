"""The job's entry points: `run_turn` (what a worker runs) and `on_failure` (RQ's failure callback).

Arguments are ids, never content or keys: the job reads its turn, and the settings stored with
it, from the state.
"""

from __future__ import annotations

import logging
import os
import time

import redis
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from agent import job_alarm
from agent.contract import Message, carried
from agent.conversation.endings import Ending, write_ending
from agent.conversation.store import Store
from agent.queue import JOB_FUNCTION
from agent.runtime.connection import state_client
from agent.settings import DEFAULT_STATE_TTL_S, TurnConfig, least_state_ttl_s
from agent.turn.loop import Turn
from agent.turn.tool_runs import answer_every_call

log = logging.getLogger(__name__)

MODEL_FIELDS = ("role", "content", "tool_calls", "tool_call_id")  # what a provider is sent of a stored message

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
        return _run(conversation_id, turn_id)


def _run(conversation_id: str, turn_id: str) -> str:
    store = _store()
    started_at, job_id = _job_started_at()
    state = store.read(conversation_id)
    if state is None:
        log.warning("turn %s: conversation %s is gone (expired?)", turn_id, conversation_id)
        return "gone"
    if state["turn_id"] != turn_id or state["done"]:
        return "stale"
    config = TurnConfig.from_dict(state["config"] or {})
    # The page may give a turn a longer job timeout than the one AGENT_STATE_TTL was checked against:
    # its conversation must still outlive the longest wait for its next write (see settings.state_ttl_s).
    store.ttl_s = max(store.ttl_s, least_state_ttl_s(config))
    if not store.claim_turn(turn_id, job_id or turn_id, ttl_s=config.job_timeout_s * 2 + 60):
        log.info("turn %s already ran (duplicate job): nothing to do", turn_id)
        return "duplicate"
    turn = Turn.create(store, conversation_id, turn_id, config, started_at=started_at,
                       history=answer_every_call([_for_model(m) for m in state["history"]]),
                       doc=carried(state), persisted_len=len(state["history"]))
    return turn.run()


def _for_model(message: Message) -> Message:
    return {k: v for k, v in message.items() if k in MODEL_FIELDS}


def on_failure(job, connection, exc_type, exc_value, tb) -> None:
    """RQ's failure callback: the safety net that writes the ending when the job itself could not."""
    if job.func_name != JOB_FUNCTION or len(job.args) != 2:
        return
    conversation_id, turn_id = job.args
    if exc_type is not None and issubclass(exc_type, JobTimeoutException):
        ending = Ending.job_timeout(job.timeout)
    else:
        ending = Ending.worker_failed(getattr(exc_type, "__name__", "error"))
    # A job that wrote nothing itself (safeguards off) still ran: RQ knows when, and its timeout.
    started_at = job.started_at.timestamp() if job.started_at else None
    job_timeout_at = started_at + job.timeout if started_at is not None and job.timeout else None
    write_ending(_store(), conversation_id, turn_id, ending, started_at=started_at, job_timeout_at=job_timeout_at)
