"""A turn a test writes in flight by hand keeps a live owner while the test looks at it (tests/live_owner.py):
on a busy machine the page's lost-worker check and the pool's watch would otherwise end or resume it."""

from __future__ import annotations

import time

from agent.hosting.lost_worker import LIMBO_GRACE_S, lost_reason
from agent.hosting.turn_watch import TurnWatch
from agent.turn.heartbeat import HEARTBEAT_TTL_S
from tests.live_owner import keep_alive, stop_all
from tests.test_app import begin, make_running


def test_a_turn_written_in_flight_is_neither_lost_nor_resumed_past_every_grace(private_redis):
    store, queue_connection = private_redis.store, private_redis.queue_connection
    queued, _ = begin(store)
    running, turn_id = begin(store)
    make_running(store, running, turn_id)
    for cid in (queued, running):
        keep_alive(store, cid)
    started = time.time()
    assert lost_reason(store, queue_connection, queued) is None  # its job is first seen off any queue's list
    time.sleep(HEARTBEAT_TTL_S + 0.5)  # past the heartbeat's life, the job's grace and the queue's limbo
    assert time.time() - started > LIMBO_GRACE_S
    watch = TurnWatch(store, queue_connection)
    watch.sweep()
    assert watch.resumed == 0
    for cid in (queued, running):
        assert lost_reason(store, queue_connection, cid) is None, cid
        assert not store.read(cid)["done"]
    assert store.read(running)["steps"][-1]["kind"] != "resume"
    stop_all()
    assert not store.flags.running(10), "the watch no longer looks at it"

