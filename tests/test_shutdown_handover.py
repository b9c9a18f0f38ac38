"""Stopping the app while a turn runs (Ctrl-C of `make run`, SIGTERM to the pool) is not a person's Stop:
the turn is handed over and resumes on the app's next start, inside its clocks; or, started again too
late, it ends saying plainly that the app was stopped.

Real Redis (private to each test), real pools stopped as the page's server stops them, the demo model."""

from __future__ import annotations

import time

from agent.turn.shutdown import stopped_with_the_app
from harness import pools
from tests.conftest import FAST, ask, start_pool, wait_done
from tests.test_resume import read_when, resume_steps, running


def in_the_wait_tool(state: dict) -> bool:
    return running(state) and (state.get("current_step") or {}).get("kind") == "tool"


def start(private_redis, tmp_path, name: str) -> pools.PoolHandle:
    handle = start_pool(private_redis.url, 1, tmp_path / f"{name}.log")
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 1)
    except BaseException:
        pools.stop_pool(handle, private_redis.url)
        raise
    return handle


def test_a_turn_the_apps_stop_interrupts_resumes_on_its_next_start(private_redis, tmp_path):
    store = private_redis.store
    config = FAST.with_changes(model="demo@0.2~0", job_timeout_s=40, deadline_margin_s=4.0, call_timeout_cap_s=10.0,
                               tool_timeout_cap_s=30.0)
    first = start(private_redis, tmp_path, "first")
    try:
        cid = ask(store, private_redis.queue, "wait 6 then 2*21", config)
        read_when(store, cid, in_the_wait_tool, 20, "the wait tool runs")
    finally:
        pools.stop_pool(first, private_redis.url)  # as Ctrl-C stops the page's server: SIGTERM, warm, then cold
    handed = store.read(cid)
    assert not handed["done"], (handed["status"], handed["error"])
    assert handed["attempt"] == 1 and stopped_with_the_app(handed["job_id"]), handed["job_id"]

    second = start(private_redis, tmp_path, "second")
    try:
        final = wait_done(store, cid, timeout_s=40)
    finally:
        pools.stop_pool(second, private_redis.url)
    assert final["status"] == "done", (final["status"], final["error"])
    [step] = resume_steps(final)
    assert step["detail"].startswith("the app was stopped while the wait tool ran; resumed when a worker started again")
    assert "42" in final["history"][-1]["content"]
    assert final["deadline_at"] == handed["deadline_at"] and final["updated_at"] < final["job_timeout_at"]


def test_a_turn_whose_app_starts_again_past_its_deadline_ends_saying_the_app_was_stopped(private_redis, tmp_path):
    store = private_redis.store
    config = FAST.with_changes(model="demo@0.2~0", job_timeout_s=10, deadline_margin_s=2.0, call_timeout_cap_s=5.0,
                               tool_timeout_cap_s=8.0)
    first = start(private_redis, tmp_path, "first")
    try:
        cid = ask(store, private_redis.queue, "wait 5 then 2*21", config)
        read_when(store, cid, in_the_wait_tool, 20, "the wait tool runs")
    finally:
        pools.stop_pool(first, private_redis.url)
    handed = store.read(cid)
    assert not handed["done"] and stopped_with_the_app(handed["job_id"])
    time.sleep(max(0.0, handed["deadline_at"] - time.time()) + 0.5)  # not an assertion: the app stays stopped

    second = start(private_redis, tmp_path, "second")
    try:
        final = wait_done(store, cid, timeout_s=20)
    finally:
        pools.stop_pool(second, private_redis.url)
    assert final["status"] == "failed", final["status"]  # not "cancelled": nobody pressed Stop
    assert final["error"]["kind"] == "shutdown"
    assert final["error"]["message"].startswith("The app was stopped while this reply was being written")
    assert final["history"][-1]["content"] == final["error"]["message"]
