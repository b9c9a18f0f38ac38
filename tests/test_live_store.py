"""The live text in the store, on a real Redis: versioned writes beside the history, refused like
every write, cleared by the write that lands the message, and read O(new)."""

from __future__ import annotations

import pytest

from agent.conversation.errors import StoreError
from agent.conversation.keys import Keys
from agent.queue import new_id

DOC = {"status": "running", "error": None, "job_id": "j", "enqueued_at": 0.0}


def begin(store):
    cid, tid = new_id(), new_id()
    store.begin_turn(cid, tid, {"role": "user", "content": "hi"}, DOC)
    return cid, tid


def head(tid, seq=1, message_index=1, attempt=1):
    return {"turn_id": tid, "message_index": message_index, "attempt": attempt, "status": "writing", "seq": seq}


def events(store, cid) -> int:
    return len(store.redis.xrange(Keys.of(cid).events))


def test_a_live_write_is_versioned_with_its_event_and_reads_back_as_the_contract_says(store):
    cid, tid = begin(store)
    version = store.version(cid)
    assert store.read(cid)["live"] is None
    assert store.write_live(cid, tid, head(tid), "Hello, wör") == "ok"
    text = "Hello, wör"
    assert store.write_live(cid, tid, head(tid), "ld", from_bytes=len(text.encode())) == "ok"
    assert store.version(cid) == version + 2
    assert store.redis.xrange(Keys.of(cid).events)[-1][0] == f"{version + 2}-1".encode()
    state = store.read(cid)
    assert state["live"] == {"turn_id": tid, "message_index": 1, "attempt": 1, "text": "Hello, wörld",
                             "status": "writing"}
    assert state["history"] == [{"role": "user", "content": "hi"}]  # the history does not have it yet
    assert 590 <= store.redis.ttl(Keys.of(cid).live) <= 600


def test_the_write_that_lands_the_message_clears_the_live_text_in_the_same_version(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "The answer is 391.")
    version = store.publish(cid, tid, DOC, new_messages=[{"role": "assistant", "content": "The answer is 391."}],
                            expected_turn_len=1, end_live=1)
    state = store.read(cid)
    assert state["version"] == version
    assert state["live"] is None and state["history"][-1]["content"] == "The answer is 391."
    assert not store.redis.exists(Keys.of(cid).live)


def test_a_late_live_write_for_a_cleared_text_is_refused_and_a_fresh_attempt_is_not(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "three words then")
    store.publish(cid, tid, DOC, end_live=1)  # the cut call's step is recorded, its text cleared
    version = store.version(cid)
    assert store.write_live(cid, tid, head(tid), " more", from_bytes=16) == "ended"
    assert store.write_live(cid, tid, head(tid), "three words then more") == "ended"
    assert store.version(cid) == version and store.read(cid)["live"] is None
    assert store.write_live(cid, tid, head(tid, seq=2, attempt=2), "A fresh") == "ok"
    assert store.read(cid)["live"]["attempt"] == 2 and store.read(cid)["live"]["text"] == "A fresh"


def test_a_publish_that_does_not_end_the_text_leaves_it(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid, seq=3), "still writing")
    store.publish(cid, tid, DOC, end_live=2)
    assert store.read(cid)["live"]["text"] == "still writing"


def test_an_append_that_does_not_start_where_the_stored_text_ends_is_not_written(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "abc")
    version = store.version(cid)
    assert store.write_live(cid, tid, head(tid), "xyz", from_bytes=5) == "lag"
    assert store.write_live(cid, tid, head(tid, seq=2, attempt=2), "xyz", from_bytes=3) == "lag"  # another text
    assert store.version(cid) == version and store.read(cid)["live"]["text"] == "abc"


def test_live_writes_are_refused_like_every_write_once_the_turn_ended_or_is_not_current(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "partial")
    store.publish(cid, tid, {**DOC, "status": "failed"}, done=True)  # an ending (from outside, too) clears it
    assert store.read(cid)["live"] is None
    with pytest.raises(StoreError) as closed:
        store.write_live(cid, tid, head(tid, seq=2), "more")
    assert closed.value.reason == "CLOSED"
    store.begin_turn(cid, new_id(), {"role": "user", "content": "next"}, DOC)
    with pytest.raises(StoreError) as stale:
        store.write_live(cid, tid, head(tid, seq=2), "more")
    assert stale.value.reason == "STALE"
    with pytest.raises(StoreError) as gone:
        store.write_live(new_id(), tid, head(tid), "more")
    assert gone.value.reason == "GONE"


def test_a_new_turn_starts_with_no_live_text_and_no_memory_of_the_last_turns_texts(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid, seq=4), "old")
    store.publish(cid, tid, DOC, end_live=4)
    store.publish(cid, tid, DOC, done=True)
    other = new_id()
    store.begin_turn(cid, other, {"role": "user", "content": "next"}, DOC)
    assert store.read(cid)["live"] is None
    assert store.write_live(cid, other, head(other, seq=1, message_index=3), "new") == "ok"


def test_read_since_fetches_only_the_live_text_not_yet_seen_of_two_megabytes(private_redis):
    store = private_redis.store
    cid, tid = begin(store)
    chunk = "0123456789 ünïcödé " * 1000  # about 20 KB, multi-byte characters included
    written = ""
    known = store.read(cid)
    per_poll = []
    while len(written.encode()) < 2_000_000:
        from_bytes = len(written.encode()) if written else None
        assert store.write_live(cid, tid, head(tid), chunk, from_bytes=from_bytes) == "ok"
        written += chunk
        before = _output_bytes(store)
        known = store.read_since(cid, known)
        per_poll.append(_output_bytes(store) - before)
        assert known["live"]["text"] == written
    # Each poll reads the new chunk and the small fields, never the whole text again.
    assert max(per_poll) < len(chunk.encode()) + 8_000, per_poll
    assert store.read(cid)["live"]["text"] == written


def test_read_since_reads_a_fresh_attempt_whole_and_a_cleared_text_as_none(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "cut after three")
    known = store.read_since(cid, store.read(cid))
    store.publish(cid, tid, DOC, end_live=1)
    store.write_live(cid, tid, head(tid, seq=2, attempt=2), "Fresh")
    fresh = store.read_since(cid, known)
    assert fresh["live"]["attempt"] == 2 and fresh["live"]["text"] == "Fresh"
    store.publish(cid, tid, DOC, new_messages=[{"role": "assistant", "content": "Fresh"}], end_live=2)
    landed = store.read_since(cid, fresh)
    assert landed["live"] is None and landed["history"][-1]["content"] == "Fresh"


def _output_bytes(store) -> int:
    """Bytes the whole server has sent to its clients so far (this test's Redis has no other client)."""
    return int(store.redis.info("stats")["total_net_output_bytes"])


def test_an_ending_written_from_outside_the_job_clears_the_live_text(store):
    from agent.conversation.endings import Ending, write_ending

    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "half a reply when the worker was lost")
    assert write_ending(store, cid, tid, Ending("failed", "worker_lost", "The worker was lost."))
    state = store.read(cid)
    assert state["done"] and state["live"] is None and not store.redis.exists(Keys.of(cid).live)
    assert state["history"][-1]["content"] == "The worker was lost."


def test_a_stalled_write_of_an_older_text_never_replaces_the_fresh_attempts_text(store):
    cid, tid = begin(store)
    store.write_live(cid, tid, head(tid), "cut")
    # The cut text's clearing write has not landed yet (a Redis hiccup) when the retry starts writing.
    assert store.write_live(cid, tid, head(tid, seq=2, attempt=2), "fresh") == "ok"
    assert store.write_live(cid, tid, head(tid), "cut and more") == "ended"
    assert store.write_live(cid, tid, head(tid), " more", from_bytes=3) == "ended"
    assert store.read(cid)["live"]["text"] == "fresh"
