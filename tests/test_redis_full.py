"""A Redis that fills up strands no turn: every message is either refused before it is accepted, or runs,
or ends with a sentence in the chat; and workers wait for room instead of crash-looping.

Real Redis (private to each test, its maxmemory set small, noeviction), real workers, a scripted model on
loopback whose replies are ~96 KB."""

from __future__ import annotations

import time

import pytest
import redis

from agent import queue as queue_module
from agent.conversation.endings import Ending, write_ending
from agent.conversation.errors import StoreFull
from agent.conversation.room import RESERVE_BYTES
from agent.queue import new_id, submit_turn
from harness import pools
from harness.waiting import wait_for
from tests.conftest import FAST, start_pool, wait_done
from tests.scripted_server import ScriptedServer, chat_reply

REPLY = "x" * 96_000  # bytes of each answer: 40 of them are more than the whole Redis holds
SMALL_REDIS = 3 * 1024 * 1024  # bytes: AGENT_REDIS_MAXMEMORY_MB=3


def fill(client: redis.Redis, limit: int) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(limit))


@pytest.fixture
def big_replies():
    server = ScriptedServer(default=chat_reply(REPLY))
    try:
        yield server
    finally:
        server.stop()


def test_forty_turns_sent_at_once_to_a_small_redis_each_end_in_the_chat_or_are_refused(private_redis, tmp_path,
                                                                                         big_replies):
    fill(private_redis.client, SMALL_REDIS)
    handle = start_pool(private_redis.url, 2, tmp_path / "pool.log")
    try:
        pools.wait_for_workers(handle, private_redis.queue_connection, 2)
        config = FAST.with_changes(provider="openai", model="scripted", base_url=big_replies.url + "/v1",
                                   job_timeout_s=20, deadline_margin_s=3.0, call_timeout_cap_s=10.0)
        accepted, refused = [], []
        for n in range(40):  # within a second: the memory reading each send checks is the same one
            cid = new_id()
            try:
                submit_turn(private_redis.store, private_redis.queue, cid, f"message {n}", config)
                accepted.append(cid)
            except StoreFull as exc:
                refused.append(str(exc))
        assert accepted and refused, (len(accepted), len(refused))
        assert all("nothing was sent" in text for text in refused), refused[0]
        for cid in accepted:
            final = wait_done(private_redis.store, cid, timeout_s=60)
            assert final["status"] == "done", (final["status"], final["error"])
            assert final["history"][-1]["content"] == REPLY
        assert private_redis.client.zcard("agent:memory:reserved") == 0, "every ending released its reservation"
    finally:
        pools.stop_pool(handle, private_redis.url)
    assert "exited with" not in (tmp_path / "pool.log").read_text(), "no worker crashed"


def test_an_accepted_turns_ending_lands_when_redis_is_full(private_redis):
    cid = new_id()
    submit_turn(private_redis.store, private_redis.queue, cid, "hello", FAST)
    turn_id = private_redis.store.read_meta(cid)["turn_id"]
    assert private_redis.client.zscore("agent:memory:reserved", f"{cid} {turn_id}"), "its memory is reserved"
    fill(private_redis.client, 1)  # one byte: every write that needs memory is refused
    try:
        with pytest.raises(redis.RedisError):
            private_redis.client.set("anything", "x")
        assert write_ending(private_redis.store, cid, turn_id, Ending.worker_lost("a test said so"))
    finally:
        fill(private_redis.client, 0)
    final = private_redis.store.read(cid)
    assert final["done"] and final["status"] == "failed" and "a test said so" in final["error"]["message"]
    assert private_redis.client.zcard("agent:memory:reserved") == 0


def test_a_turn_whose_job_redis_refuses_ends_saying_so(private_redis, monkeypatch):
    """Accepted, then Redis fills before its job is on the queue: it ends with the reason, never waits."""
    enqueue = queue_module.enqueue_turn

    def fill_then_enqueue(*args, **kwargs):
        fill(private_redis.client, 1)
        return enqueue(*args, **kwargs)

    monkeypatch.setattr(queue_module, "enqueue_turn", fill_then_enqueue)
    cid = new_id()
    try:
        with pytest.raises(redis.RedisError):
            submit_turn(private_redis.store, private_redis.queue, cid, "hello", FAST)
    finally:
        fill(private_redis.client, 0)
    final = private_redis.store.read(cid)
    assert final["done"] and final["status"] == "failed", final["status"]
    assert final["error"]["kind"] == "not_queued" and "Redis is full" in final["error"]["message"]


def test_reservations_count_the_turns_in_flight_and_refuse_the_one_that_does_not_fit(private_redis):
    used = int(private_redis.client.info("memory")["used_memory"])
    # Room for exactly three reservations under 90% of the limit.
    fill(private_redis.client, int((used + 3.5 * RESERVE_BYTES) / 0.9))
    try:
        for _ in range(3):
            submit_turn(private_redis.store, private_redis.queue, new_id(), "hello", FAST)
        with pytest.raises(StoreFull):
            submit_turn(private_redis.store, private_redis.queue, new_id(), "one too many", FAST)
    finally:
        fill(private_redis.client, 0)


def test_a_worker_waits_while_redis_is_full_and_works_once_it_has_room(private_redis, tmp_path):
    fill(private_redis.client, 1)
    handle = start_pool(private_redis.url, 1, tmp_path / "pool.log")
    try:
        log = tmp_path / "pool.log"
        wait_for(lambda: "tries again" in log.read_text(), 20, "the worker says it waits")
        worker = pools.worker_pids(handle)
        time.sleep(4)  # not an assertion: long enough for a crash loop to have restarted it a few times
        assert pools.worker_pids(handle) == worker, "the same worker, waiting"
        assert "exited with" not in log.read_text()
        fill(private_redis.client, 0)
        cid = new_id()
        submit_turn(private_redis.store, private_redis.queue, cid, "What is 6*7?", FAST)
        assert wait_done(private_redis.store, cid, timeout_s=40)["status"] == "done"
    finally:
        fill(private_redis.client, 0)
        pools.stop_pool(handle, private_redis.url)


def test_a_full_redis_does_not_make_a_live_worker_or_its_turn_look_lost(private_redis):
    from agent.conversation import workers
    from agent.turn.heartbeat import ALIVE_MS, HEARTBEAT_S, HEARTBEAT_TTL_S

    client, flags = private_redis.client, private_redis.store.flags
    flags.start_running("conversation", "turn", "job", ALIVE_MS)
    workers.beat(client, "worker-1", "busy")
    fill(client, 1)
    try:
        end = time.monotonic() + HEARTBEAT_TTL_S + 1  # past the TTL of the marks written before it was full
        while time.monotonic() < end:
            flags.beat("conversation", "turn", "job", ALIVE_MS)
            workers.beat(client, "worker-1", "busy")
            time.sleep(HEARTBEAT_S / 2)
        assert flags.alive(["turn"]) == [True]
        assert workers.live_workers(client) == (1, 1)
    finally:
        fill(client, 0)



def test_an_accepted_turn_whose_job_is_gone_ends_saying_so_with_no_page_open(private_redis, tmp_path):
    """Its sender died between accepting it and enqueuing its job (or the job was lost): the pool's watch,
    not only a page, finds it in the index of accepted turns and ends it with the reason."""
    from agent.hosting.lost_worker import CALLBACK_GRACE_S
    from agent.hosting.turn_watch import STRANDED_EVERY_S

    cid = new_id()
    monkey = pytest.MonkeyPatch()
    monkey.setattr(queue_module, "enqueue_turn", lambda *args, **kwargs: None)  # the sender dies here
    try:
        submit_turn(private_redis.store, private_redis.queue, cid, "hello", FAST)
    finally:
        monkey.undo()
    assert private_redis.store.read_meta(cid)["status"] == "queued"
    handle = start_pool(private_redis.url, 1, tmp_path / "pool.log")  # its watch; no page, no CLI
    try:
        final = wait_done(private_redis.store, cid, timeout_s=STRANDED_EVERY_S + CALLBACK_GRACE_S + 10)
    finally:
        pools.stop_pool(handle, private_redis.url)
    assert final["status"] == "failed" and "its job is gone from the queue" in final["error"]["message"]
    assert private_redis.client.zcard("agent:memory:reserved") == 0
