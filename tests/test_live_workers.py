"""The workers the page counts are the ones there now: a killed pool's workers stop counting within
seconds, although RQ keeps their registrations for minutes; a busy one counts as busy."""

from __future__ import annotations

import os
import signal

from rq import Worker

from agent.queue import running_workers, worker_counts
from harness import pools
from harness.waiting import wait_for
from tests.conftest import FAST, ask, start_pool
from tests.test_resume import read_when, running

# Three missed beats (3 s), plus a look, plus a second of margin.
GONE_WITHIN_S = 3.0 + 1.0 + 1.0
SLOW = FAST.with_changes(model="demo@3~0", job_timeout_s=20, deadline_margin_s=3.0, call_timeout_cap_s=10.0)


def test_a_killed_pools_workers_stop_counting_though_rq_still_lists_them(private_redis, tmp_path):
    handle = start_pool(private_redis.url, 2, tmp_path / "pool.log")
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 2)
        assert wait_for(lambda: worker_counts(private_redis.queue) == (2, 0), 5, "2 idle workers counted")
        cid = ask(private_redis.store, private_redis.queue, "hello", SLOW)
        read_when(private_redis.store, cid, running, 20, "the turn runs")
        assert wait_for(lambda: worker_counts(private_redis.queue) == (2, 1), 5, "one of them busy")

        os.kill(handle.proc.pid, signal.SIGKILL)  # the supervisor: its workers die with it
        wait_for(lambda: running_workers(private_redis.queue) == 0, GONE_WITHIN_S, "no worker counted")
        assert worker_counts(private_redis.queue) == (0, 0)
        # What the page counted before: RQ's registrations, which the dead workers left behind.
        assert Worker.count(connection=private_redis.queue_connection) == 2
    finally:
        pools.stop_pool(handle, private_redis.url)


def test_a_worker_that_stops_is_no_longer_counted_at_once(private_redis, tmp_path):
    handle = start_pool(private_redis.url, 1, tmp_path / "pool.log")
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 1)
        wait_for(lambda: running_workers(private_redis.queue) == 1, 5, "the worker counted")
    finally:
        pools.stop_pool(handle, private_redis.url)
    assert running_workers(private_redis.queue) == 0, "a worker that stopped takes its mark with it"


def test_the_page_counts_no_dead_worker_and_says_that_none_is_running(private_redis, tmp_path):
    from tests.apptest_page import app, page_environment, texts

    handle = start_pool(private_redis.url, 2, tmp_path / "pool.log")
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 2)
        os.kill(handle.proc.pid, signal.SIGKILL)  # the supervisor, and with it its workers
        wait_for(lambda: running_workers(private_redis.queue) == 0, GONE_WITHIN_S, "no worker counted")
    finally:
        pools.stop_pool(handle, private_redis.url)
    assert Worker.count(connection=private_redis.queue_connection) == 2, "RQ still lists the dead workers"
    cid = ask(private_redis.store, private_redis.queue, "hello", FAST)
    with page_environment(private_redis.url, {"AGENT_WORKERS": "0", "AGENT_PROVIDER": "demo"}):
        at = app(cid)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        page = texts(at)
    assert "place 1 in the queue · 0 workers, 0 busy" in page.replace("*", ""), page
    assert "No worker is running. Start one with `python worker.py`" in page


def test_with_workers_of_its_own_the_page_says_it_is_starting_them_again():
    from agent.ui.follower import no_worker_text

    assert no_worker_text(2).startswith("No worker is running: this app's workers stopped, and it is starting them")
    assert "python worker.py" in no_worker_text(0) and "python worker.py" not in no_worker_text(2)
