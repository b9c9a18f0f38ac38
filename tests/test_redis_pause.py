"""A Redis that pauses makes no healthy worker count as lost. Its clock stops, and when it resumes every
heartbeat whose TTL passed meanwhile expires at once, before the workers' renewals land: the watch, whose
own looks failed or stalled, gives the heartbeats a fresh grace instead of resuming the turns elsewhere.

Real Redis (private to each test, frozen with SIGSTOP), the watch and the heartbeat as the pool runs them."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

from rq.job import JobStatus
from rq.serializers import JSONSerializer

from agent.contract import Role, queued_doc
from agent.hosting.turn_watch import TurnWatch
from agent.queue import JOB_FUNCTION, SafeJob, new_id
from agent.turn.heartbeat import ALIVE_MS, HEARTBEAT_S, HEARTBEAT_TTL_S
from harness import pools
from harness.waiting import wait_for
from tests.conftest import FAST, ask, start_pool, wait_done
from tests.test_resume import read_when, resume_steps, running

PAUSE_S = HEARTBEAT_TTL_S + 3.0  # seconds Redis is frozen: every heartbeat's TTL passes meanwhile


def pause(private_redis, seconds: float) -> None:
    os.kill(private_redis.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        private_redis.resume()


def beat_and_look(store, watch: TurnWatch, cid: str, turn_id: str, job_id: str, seconds: float) -> None:
    """A healthy worker's heartbeat and the watch's looks, for `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        store.flags.beat(cid, turn_id, job_id, ALIVE_MS)
        watch.sweep()
        time.sleep(HEARTBEAT_S / 2)


def test_a_heartbeat_that_lapsed_while_redis_was_paused_gets_a_fresh_grace(private_redis):
    store = private_redis.store
    cid, turn_id, job_id = new_id(), new_id(), "turn-job-of-a-test"  # started, then silent: lost once it lapses
    store.begin_turn(cid, turn_id, {"role": Role.USER, "content": "hello"},
                     queued_doc(FAST.to_dict(), job_id, time.time()))
    # Its job's record, as RQ keeps it for a started job: without one the watch's look for accepted turns whose
    # job is gone would end it before the pause, and the lapse this test is about would never be seen.
    job = SafeJob.create(JOB_FUNCTION, args=(cid, turn_id), id=job_id, connection=private_redis.queue_connection,
                         serializer=JSONSerializer)
    job.started_at = datetime.now(UTC)
    job.save()
    job.set_status(JobStatus.STARTED)
    store.flags.start_running(cid, turn_id, job_id, ALIVE_MS)
    watch = TurnWatch(store, private_redis.queue_connection)
    beat_and_look(store, watch, cid, turn_id, job_id, HEARTBEAT_TTL_S + 1)  # past the grace a new watch starts with
    assert watch.held_off == 0

    pause(private_redis, PAUSE_S)
    assert store.flags.alive([turn_id]) == [False], "the mark expired the moment Redis resumed"
    watch.sweep()  # before the worker's renewal lands
    assert watch.held_off == 1
    meta = store.read_meta(cid)
    assert not meta["done"] and meta["attempt"] == 0, "not taken for a lost worker"

    beat_and_look(store, watch, cid, turn_id, job_id, HEARTBEAT_TTL_S + 1)  # the worker beats again: never lost
    meta = store.read_meta(cid)
    assert not meta["done"] and meta["attempt"] == 0

    # A worker that really is gone is still found, once Redis has answered for a heartbeat's TTL: its turn, which
    # its job never began (no clocks of its own), is queued again.
    wait_for(lambda: watch.sweep() or store.read_meta(cid)["attempt"] == 1, HEARTBEAT_TTL_S + 2,
             "the lost turn handed over")


def test_a_tool_sequence_through_a_redis_pause_finishes_on_its_own_worker(private_redis, tmp_path):
    handle = start_pool(private_redis.url, 2, tmp_path / "pool.log")
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 2)
        time.sleep(HEARTBEAT_TTL_S)  # not an assertion: past the grace the pool's new watch starts with
        config = FAST.with_changes(model="demo@0.2~0", job_timeout_s=40, deadline_margin_s=4.0,
                                   call_timeout_cap_s=10.0, tool_timeout_cap_s=30.0)
        cid = ask(private_redis.store, private_redis.queue, "wait 10 then 2*21", config)
        read_when(private_redis.store, cid, lambda s: running(s) and s.get("current_step")
                  and s["current_step"]["kind"] == "tool", 20, "the wait tool runs")
        pause(private_redis, PAUSE_S)
        final = wait_done(private_redis.store, cid, timeout_s=40)
    finally:
        pools.stop_pool(handle, private_redis.url)
    assert final["status"] == "done", (final["status"], final["error"])
    assert resume_steps(final) == [] and final["attempt"] == 0, "resumed while its worker was alive"
    tools = [m for m in final["history"] if m["role"] == "tool"]
    assert tools and not any("may or may not" in m["content"] or "worker was lost" in m["content"] for m in tools)
