"""A turn that waits in the queue, or runs, longer than AGENT_STATE_TTL: its state lives while its job
can still run or write, and a job dropped for waiting too long is ended in words. Real Redis, real
workers, the clocks scaled down (a state TTL of seconds, not minutes)."""

from __future__ import annotations

import math
import time

from agent import queue as queue_module
from agent.conversation.keys import Keys
from agent.conversation.store import Store
from agent.deadline import LOST_GRACE_S
from agent.hosting.lost_worker import lost_worker_check
from agent.queue import job_status, new_id, submit_turn
from agent.settings import least_state_ttl_s
from harness.pools import stop_pool
from harness.waiting import wait_for
from tests.conftest import FAST, start_pool, wait_done

SLOW = FAST.with_changes(model="demo@2.5", job_timeout_s=10, deadline_margin_s=2.0, call_timeout_cap_s=5.0)
# Seconds: the scaled-down AGENT_STATE_TTL, the least the settings accept for these turns' clocks (a
# state must outlive the longest a running turn may go without a write).
STATE_TTL_S = math.ceil(max(SLOW.job_timeout_s, FAST.job_timeout_s) + LOST_GRACE_S)
BUSY_TURNS = 4  # slow turns of two 2.5 s model calls each, ahead in the queue: longer than the state TTL


def test_a_turn_queued_longer_than_the_state_ttl_still_runs_and_answers(private_redis, tmp_path):
    url = private_redis.url
    handle = start_pool(url, 1, tmp_path / "pool.log", extra_env={"AGENT_STATE_TTL": str(STATE_TTL_S)})
    client = private_redis.client
    try:
        store = Store(client, ttl_s=STATE_TTL_S)
        queue = private_redis.queue
        # The one worker is busy with slow turns (about 5 s each), and the turn under test queues
        # behind them all: it waits well past the state TTL.
        assert BUSY_TURNS * 2 * 2.5 > STATE_TTL_S + 2
        busy = [new_id() for _ in range(BUSY_TURNS)]
        for cid in busy:
            submit_turn(store, queue, cid, "What is 17*23?", SLOW)
        waiting = new_id()
        submit_turn(store, queue, waiting, "What is 2+2?", FAST)
        enqueued = time.monotonic()
        assert client.ttl(Keys.of(waiting).meta) > STATE_TTL_S  # its state covers the time it may wait

        state = wait_done(store, waiting, timeout_s=90)
        assert time.monotonic() - enqueued > STATE_TTL_S  # it did wait longer than the TTL
        assert state["status"] == "done", state["history"][-1]
        assert "4" in state["history"][-1]["content"]
        assert state["started_at"] - state["enqueued_at"] > STATE_TTL_S
        # Once it has run, the conversation lives AGENT_STATE_TTL after its last write, as before.
        assert 0 < client.ttl(Keys.of(waiting).meta) <= STATE_TTL_S
    finally:
        stop_pool(handle, url)


def test_a_turn_dropped_for_waiting_longer_than_the_queue_allows_is_ended_in_words(private_redis, monkeypatch):
    # No worker at all: the job waits until RQ drops it at the queue's wait limit (scaled down).
    monkeypatch.setattr(queue_module, "QUEUE_WAIT_S", 2)
    # A TTL far below any the settings accept (job timeout + LOST_GRACE_S): only the queued turn's own
    # TTL can keep this conversation past it, which is what is shown here.
    store = Store(private_redis.client, ttl_s=1)
    connection = private_redis.queue_connection
    cid = new_id()
    submit_turn(store, private_redis.queue, cid, "What is 2+2?", FAST)
    job_id = store.read_meta(cid)["job_id"]
    wait_for(lambda: job_status(connection, job_id) is None, 30, "RQ dropped the job")
    # The conversation outlived its 1 s TTL, so the front end can still say what happened.
    assert store.read(cid) is not None
    assert lost_worker_check(store, connection, cid)
    state = store.read(cid)
    assert state["done"] and state["status"] == "failed"
    assert state["error"]["kind"] == "queue_expired"
    assert "No worker was free" in state["history"][-1]["content"]
    assert "Send your message again" in state["history"][-1]["content"]


SHORT_TTL_S = 3  # seconds: the AGENT_STATE_TTL of the review's report, shorter than one model call below
# One 5 s model call, on a job timeout the page may choose, longer than the workers' settings checked.
LONG_CALL = FAST.with_changes(model="demo@5", job_timeout_s=20, deadline_margin_s=2.0, call_timeout_cap_s=10.0)


def test_a_turn_whose_model_call_outlasts_the_state_ttl_keeps_its_conversation(private_redis, tmp_path):
    """AGENT_STATE_TTL=3 with a 5 s model call deleted the conversation mid-turn, the user's message with
    it. The settings now refuse such a TTL at start; a turn whose own job timeout is longer than the one
    they checked (the page sets it per turn) keeps its conversation for that job timeout and its grace."""
    url = private_redis.url
    handle = start_pool(url, 1, tmp_path / "pool.log", extra_env={"AGENT_STATE_TTL": str(SHORT_TTL_S)})
    try:
        store = Store(private_redis.client, ttl_s=SHORT_TTL_S)
        cid = new_id()
        submit_turn(store, private_redis.queue, cid, "What is 2+2?", LONG_CALL)
        state = wait_done(store, cid, timeout_s=60)
        assert state["status"] == "done" and state["history"][0]["content"] == "What is 2+2?"
        assert SHORT_TTL_S < private_redis.client.ttl(Keys.of(cid).meta) <= least_state_ttl_s(LONG_CALL)
    finally:
        stop_pool(handle, url)
