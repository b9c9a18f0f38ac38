"""A turn outlives its worker: it is resumed by a new job, from the history as last published, inside
the turn's own clocks.

Who notices (`resume_or_end`): the pool's supervisors, whose watch sees a running turn's heartbeat lapse
(agent/hosting/turn_watch.py), and the front ends' lost-worker check, the net. One atomic step in the
store hands the turn to the new job (scripts/resume.lua), so it is resumed exactly once however many
noticed; every later write of the lost job is refused. No resume is made past AGENT_MAX_RESUMES, or
with less than the minimum call time left before the deadline: the ending then says the worker was
lost and why the turn could not go on.

The clocks stay the turn's: its deadline and job-timeout instant were fixed when it first started. The
new job's RQ timeout is what remains up to that instant, and its own deadline is the turn's, so its final
write still lands before the turn's original job timeout, however many workers die.

A turn whose job was lost before its first write has no clocks of its own yet (a fresh turn, or the
continuation after an answer, which runs on a fresh set): it is handed over the same way, and its new job
starts it on the clocks it was sent with, its job timeout counting from that job's start, with a resume step
that says the worker that took it from the queue was lost before it began (`Resumption.requeued`).

A turn answered after it parked on a request for approval (approvals.py) is continued the same way, from
the same `Resumption`, but on a fresh set of clocks and without a resume step.

What the new job finds (`Resumption`): the attempt, the gap to record as a step, a streamed text the
crash cut (kept on that step, never in the history), the tool calls of the last response that have
no result, and the one among them that had started (a tool that is not safe to repeat starts only once
its start is stored, with every result before it: tool_runs.py). That one runs again only when safe to
repeat; the others had not started, or are safe to repeat, and run.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from rq import Queue

from agent.contract import Kind, Role, State
from agent.conversation.endings import Ending, write_ending
from agent.conversation.store import Store
from agent.providers.base import ToolCall
from agent.queue import enqueue_turn, job_id_for, queue_wait_s
from agent.settings import TurnConfig
from agent.turn.heartbeat import ALIVE_MS
from agent.turn.shutdown import stopped_with_the_app

log = logging.getLogger(__name__)


def resume_or_end(store: Store, queue: Queue, conversation_id: str, state: State, lost_writer: str,
                  reason: str, *, known_dead: bool = False) -> str:
    """Resume the turn whose job `lost_writer` was lost, or end it saying why it cannot go on.

    A turn whose lost job never made its first write (taken off the queue, even marked started by RQ or
    claimed, but no clocks of its own yet: a fresh turn, or the continuation after an answer) has nothing to
    resume: it is queued again, through the same exactly-once hand-over, and its new job starts it on the
    clocks it was sent with (its job timeout counts from that job's start, as RQ's does), at the front of the
    queue and within what is left of its wait for a worker.

    `known_dead`: the caller saw the job's process end (its supervisor saw the worker, or RQ the work
    horse, exit), so its heartbeat mark, which may live on for a moment, does not hold the hand-over back.
    Returns "resumed", "ended", or what the store found instead ("taken": another job owns it now;
    "ended" too when it was not in flight any more)."""
    turn_id, attempt = state["turn_id"], state["attempt"]
    config = TurnConfig.from_dict(state["config"] or {})
    now = time.time()
    started = began(state)
    remaining = (state["deadline_at"] or now) - now
    wait_left = queue_wait_s(store.ttl_s) - (now - (state["enqueued_at"] or now))
    ending = None
    if attempt >= config.max_resumes:
        ending = Ending.worker_lost_no_resume(reason, attempt)
    elif started and remaining < config.min_call_s:
        ending = Ending.worker_lost_no_time(reason, remaining, config.min_call_s)
    elif not started and wait_left < 1:
        ending = Ending.queue_expired(f"{reason}, after it had waited the longest a message may wait")
    if ending is not None and stopped_with_the_app(lost_writer):  # handed over at a stop, not taken up in time
        ending = Ending.app_stopped(f"no worker took it up again before its deadline ({reason})")
    if ending is not None:
        written = write_ending(store, conversation_id, turn_id, ending, writer=lost_writer)
        return "ended" if written else "taken"
    new_writer = f"{job_id_for(turn_id)}-resume-{attempt + 1}"
    outcome, new_attempt = store.resume(conversation_id, turn_id, lost_writer, new_writer,
                                        max_resumes=config.max_resumes, alive_ms=ALIVE_MS, by_itself=known_dead)
    if outcome != "ok":
        return outcome
    # A job a worker took and never started stays in RQ's intermediate queue, where RQ's own look would fail it
    # minutes from now: it is ours to drop.
    queue.connection.lrem(queue.intermediate_queue_key, 0, lost_writer)
    if not started:
        enqueue_turn(queue, conversation_id, turn_id, new_writer, job_timeout_s=config.job_timeout_s,
                     wait_s=max(1, math.floor(wait_left)), at_front=True)
        log.warning("turn %s: its job was lost before it began the turn (%s); queued again as %s (attempt %d)",
                    turn_id, reason, new_writer, new_attempt)
        return "resumed"
    job_timeout_at = state["job_timeout_at"] or now + config.job_timeout_s
    # RQ's timeout for the new job: what remains up to the turn's own job-timeout instant, never more.
    enqueue_turn(queue, conversation_id, turn_id, new_writer, job_timeout_s=max(1, math.floor(job_timeout_at - now)),
                 wait_s=max(1, math.floor(remaining - config.min_call_s)), at_front=True)
    log.warning("turn %s: its worker was lost (%s); resumed as %s (attempt %d), %.1f s before its deadline",
                turn_id, reason, new_writer, new_attempt, remaining)
    return "resumed"


def began(state: State) -> bool:
    """Whether a job began the turn's current run: its first write set the clocks it runs on. (Not yet for a
    turn still queued, nor for the continuation after an answer, which runs on clocks of its own.)"""
    return bool(state["started_at"] and state["deadline_at"])


@dataclass(frozen=True)
class Resumption:
    """What a resumed job (or a continuation after an answer) takes over from the state as last published."""

    attempt: int  # 1, 2, ...: this job's resume
    lost_at: float  # the last write before the loss: where the gap starts
    partial_text: str  # a streamed text the loss cut ("" for none)
    live_seq: int  # that text's seq: the first write clears it, and later texts follow it
    pending: tuple[ToolCall, ...]  # the last response's tool calls that have no result, in order
    started: frozenset[str]  # the ids of those that may have started on the lost worker
    rounds: int  # model responses this turn already has
    steps: int  # steps this turn already recorded
    call_ids: frozenset[str]  # the turn's tool call ids so far
    answered: tuple[str, str] | None = None  # (call id, a person's answer) of the turn's answered request
    after_answer: bool = False  # this job continues the turn after that answer, on fresh clocks (approvals.py)
    requeued: bool = False  # the lost job never began the turn: this one starts it, on the clocks it was sent with

    @classmethod
    def of(cls, state: State, live_seq: int) -> Resumption:
        turn_id, history = state["turn_id"], state["history"]
        start = max((i for i, m in enumerate(history) if m.get("role") == Role.USER), default=0)
        turn = history[start:]
        answered = {m.get("tool_call_id") for m in turn if m.get("role") == Role.TOOL}
        responses = [m for m in turn if m.get("role") == Role.ASSISTANT]
        calls = [_tool_call(c) for m in responses for c in (m.get("tool_calls") or [])]
        last_calls = [_tool_call(c) for c in (responses[-1].get("tool_calls") or [])] if responses else []
        approval = state.get("approval")
        decided = (approval["call_id"], approval["answer"]) if approval and approval.get("answer") else None
        live = state.get("live")
        cut = live["text"] if live and live["turn_id"] == turn_id else ""
        pending = tuple(c for c in last_calls if c.id not in answered)
        return cls(attempt=state["attempt"], lost_at=state["updated_at"] or time.time(), partial_text=cut,
                   live_seq=live_seq, pending=pending, started=_started(state.get("current_step"), pending),
                   rounds=len(responses),
                   steps=max((s.get("index") or 0 for s in state["steps"] if s.get("turn_id") == turn_id), default=0),
                   call_ids=frozenset(c.id for c in calls), answered=decided)


def _started(current: dict | None, pending: tuple[ToolCall, ...]) -> frozenset[str]:
    """The pending call that may have started: the tool run the state last said was running. (A state
    written before tool runs carried their call id names the first pending call, as it then was.)"""
    if not current or current.get("kind") != Kind.TOOL or not pending:
        return frozenset()
    if "call_id" not in current:
        return frozenset({pending[0].id})
    return frozenset({current["call_id"]}) & {c.id for c in pending}


def _tool_call(raw: dict) -> ToolCall:
    function = raw.get("function") or {}
    return ToolCall(id=str(raw.get("id") or ""), name=str(function.get("name") or ""),
                    arguments=str(function.get("arguments") or "{}"))
