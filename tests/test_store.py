"""The state store on a real Redis: the contract's object, one turn at a time, refusals, cheap reads."""

from __future__ import annotations

import threading
import time

import pytest

from agent.conversation.errors import StoreError, TurnInFlight
from agent.queue import new_id

DOC = {"status": "queued", "error": None, "job_id": "j", "enqueued_at": 0.0}


def begin(store, cid=None, tid=None):
    cid, tid = cid or new_id(), tid or new_id()
    store.begin_turn(cid, tid, {"role": "user", "content": "hi"}, DOC)
    return cid, tid


def test_a_turn_in_flight_refuses_another_turn_but_not_a_double_submit_of_itself(store):
    cid, tid = begin(store)
    assert store.begin_turn(cid, tid, {"role": "user", "content": "hi"}, DOC)[0] is False  # same turn again
    with pytest.raises(TurnInFlight):
        store.begin_turn(cid, new_id(), {"role": "user", "content": "another"}, DOC)
    assert len(store.read(cid)["history"]) == 1


def test_done_never_reverts_and_an_ended_turn_refuses_writes(store):
    cid, tid = begin(store)
    store.publish(cid, tid, {**DOC, "status": "done"}, done=True)
    with pytest.raises(StoreError) as info:
        store.publish(cid, tid, {**DOC, "status": "running"}, new_messages=[{"role": "assistant", "content": "x"}])
    assert info.value.reason == "CLOSED"
    state = store.read(cid)
    assert state["done"] and state["status"] == "done" and len(state["history"]) == 1


def test_a_write_for_a_turn_that_is_not_current_is_refused(store):
    cid, old = begin(store)
    store.publish(cid, old, DOC, done=True)
    begin(store, cid)
    with pytest.raises(StoreError) as info:
        store.publish(cid, old, DOC)
    assert info.value.reason == "STALE"


def test_a_write_expecting_another_number_of_the_turns_messages_is_refused(store):
    cid, tid = begin(store)
    with pytest.raises(StoreError) as info:
        store.publish(cid, tid, DOC, new_messages=[{"role": "assistant", "content": "x"}], expected_turn_len=5)
    assert info.value.reason == "CONFLICT"


def test_every_write_bumps_the_version_by_one_and_refreshes_the_ttl(store):
    cid, tid = begin(store)
    versions = [store.version(cid)]
    for _ in range(3):
        store.redis.expire(f"agent:conv:{cid}:tree", 5)
        versions.append(store.publish(cid, tid, DOC, new_messages=[{"role": "assistant", "content": "x"}]))
    assert versions == [1, 2, 3, 4]
    assert store.redis.ttl(f"agent:conv:{cid}:tree") > 500


def test_read_since_returns_the_same_object_as_a_full_read(store):
    cid, tid = begin(store)
    first = store.read(cid)
    store.publish(cid, tid, {**DOC, "status": "running"}, new_messages=[{"role": "assistant", "content": "a"}],
                  new_steps=[{"turn_id": tid, "index": 1}])
    assert store.read_since(cid, first) == store.read(cid)
    store.publish(cid, tid, {**DOC, "status": "done"}, done=True, summary={"turn_id": tid, "status": "done"})
    assert store.read_since(cid, first) == store.read(cid)


def test_wait_version_wakes_as_soon_as_a_write_lands(store, redis_url, monkeypatch):
    # A 30 s block (on a client that allows it): waking on the write is told from timing out
    # by a wide gap, however busy the machine is.
    import redis

    from agent.conversation import reads
    from agent.conversation.store import Store

    monkeypatch.setattr(reads, "MAX_BLOCK_MS", 30_000)
    cid, tid = begin(store)
    client = redis.Redis.from_url(redis_url, socket_timeout=60)
    writer = threading.Timer(0.2, lambda: store.publish(cid, tid, DOC))
    try:
        waiter = Store(client, ttl_s=600)
        writer.start()
        started = time.monotonic()
        assert waiter.wait_version(cid, 1, timeout_ms=30_000) == 2
        assert time.monotonic() - started < 15
    finally:
        writer.join(10)  # its reply read before the store's client closes with the test
        client.close()


def test_an_unknown_conversation_reads_as_none(store):
    assert store.read("nope-" + new_id()) is None
    assert store.version("nope-" + new_id()) is None


def test_every_refusal_of_the_store_has_one_root_and_a_new_message_s_refusals_one_branch():
    from agent.conversation import errors
    from agent.conversation.well_formed import UnreadableState

    refusals = [errors.TurnInFlight("c", "t"), errors.ConversationGone("c", deleted=True),
                errors.ConversationFull("c", 2, 1), errors.StoreFull(2, 1)]
    assert all(isinstance(exc, errors.MessageRefused) for exc in refusals)
    assert UnreadableState is errors.UnreadableState  # the read rule raises the store's own
    for exc in [*refusals, errors.StoreError("GONE", "gone"), UnreadableState("c", "why")]:
        assert isinstance(exc, errors.StoreRefused)
    assert not issubclass(errors.StoreError, errors.MessageRefused)


def test_a_job_missing_from_its_queue_is_remembered_from_its_first_sighting_until_it_is_seen_again(store):
    job_id = new_id()
    assert store.flags.off_queue_since(job_id, 100.0) == 100.0
    assert store.flags.off_queue_since(job_id, 105.0) == 100.0  # the first sighting, across polls
    assert 0 < store.redis.ttl(f"agent:job:{job_id}:off-queue-since") <= 600
    store.flags.on_queue(job_id)
    assert store.flags.off_queue_since(job_id, 110.0) == 110.0


def test_every_key_a_turn_and_a_delete_leave_is_one_the_key_layout_lists(private_redis):
    import re

    from agent.conversation import keys, sign_outs

    store = private_redis.store  # a Redis of its own: every key in it is one this test made
    cid, tid = begin(store)
    store.request_cancel(tid, 60)
    store.claim_turn(tid, "job", 60)
    store.flags.off_queue_since("job", time.time())
    store.publish(cid, tid, {**DOC, "status": "done"}, done=True, summary={"turn_id": tid, "status": "done"})
    gone_cid, _ = begin(store)
    store.delete(gone_cid)
    sign_outs.sign_out(store.redis, sign_outs.sign_in_id({"iss": "i", "sub": "s", "iat": 1}), "p" + "0" * 20)
    listed = [re.sub(r"\\\{\w+\\\}", "[^:]+", re.escape(line.split()[0]))
              for line in keys.__doc__.splitlines() if line.strip().startswith("agent:")]
    written = [key.decode() for key in store.redis.scan_iter("agent:*")]
    unlisted = [key for key in written if not any(re.fullmatch(pattern, key) for pattern in listed)]
    assert written and not unlisted


def test_the_lua_scripts_are_read_from_the_package_once_and_registered_on_each_client(store):
    from agent.conversation import lua

    assert lua.source("publish") is lua.source("publish")
    assert store.scripts.publish.script == lua.source("publish")
    assert sorted(path.stem for path in lua.SCRIPTS_DIR.glob("*.lua")) == sorted(
        field for field in lua.Scripts.__dataclass_fields__)
