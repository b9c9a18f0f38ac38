"""Live as it is written: streamed replies through real workers, a real Redis and a scripted
server that streams server-sent events on loopback, followed the way the page follows them."""

from __future__ import annotations

import pytest

from agent.turn.response_limits import MAX_CONTENT_CHARS
from agent.turn.writer import LIVE_WRITE_INTERVAL_S, MAX_LIVE_CHARS
from harness.waiting import wait_for
from tests.conftest import ask, wait_done
from tests.scripted_server import ScriptedServer, chat_reply, tool_call
from tests.sse_stream import ERROR, STALL, reply_stream
from tests.test_turn import ended_within, scripted_config, steps_of

pytestmark = pytest.mark.usefixtures("pool")

# Clocks long enough that only what a test does ends a call: a 25 s deadline, 20 s per call.
LONG = dict(job_timeout_s=30, deadline_margin_s=5.0, call_timeout_cap_s=20.0)
WRITES_BEYOND_ONE_PER_INTERVAL = 3  # the first write comes at once; one may straddle an interval
NON_LIVE_WRITES = 4  # begin, running, before the call, the ending


def follow(store, cid, timeout_s=30.0) -> tuple[dict, list[dict]]:
    """The final state, and every state a client that polls saw on the way."""
    seen: list[dict] = []
    final = wait_done(store, cid, timeout_s=timeout_s, on_state=seen.append)
    return final, seen


def lives(seen: list[dict]) -> list[dict]:
    return [s["live"] for s in seen if s["live"]]


def test_a_streamed_reply_is_seen_growing_then_lands_in_the_history_with_its_usage(store, queue, scripted):
    words = [f"word{i} " for i in range(40)]
    scripted.add(reply_stream(words, pause_s=0.05))
    cid = ask(store, queue, "talk", scripted_config(scripted, **LONG))
    final, seen = follow(store, cid)
    assert final["status"] == "done" and final["live"] is None
    assert final["history"][-1] == {"role": "assistant", "content": "".join(words)}
    texts = [live["text"] for live in lives(seen)]
    assert len(set(texts)) >= 2, texts  # it grew under the client's eyes
    assert all("".join(words).startswith(text) for text in texts)
    assert {(live["message_index"], live["attempt"], live["status"]) for live in lives(seen)} == {(1, 1, "writing")}
    (model,) = steps_of(final, "model")
    assert model["usage"] == {"input_tokens": 42, "output_tokens": 7}
    # A version that shows the message never shows it live too.
    assert not any(s["live"] and len(s["history"]) > 1 for s in seen)


def test_a_stream_of_100_000_tiny_chunks_makes_about_one_live_write_per_interval(store, queue, scripted):
    scripted.add(reply_stream(["x"] * 100_000, per_write=500, pause_s=0.01))
    cid = ask(store, queue, "flood", scripted_config(scripted, **LONG))
    final = wait_done(store, cid, timeout_s=40)
    assert final["status"] == "done", final["steps"]
    assert final["history"][-1]["content"] == "x" * 100_000
    (model,) = steps_of(final, "model")
    live_writes = final["version"] - NON_LIVE_WRITES
    assert 1 <= live_writes <= model["duration_s"] / LIVE_WRITE_INTERVAL_S + WRITES_BEYOND_ONE_PER_INTERVAL, (
        live_writes, model["duration_s"])


def test_a_stream_that_stalls_after_three_words_is_cut_at_the_call_timeout_and_never_reaches_the_history(
        store, queue):
    with ScriptedServer(default=reply_stream(["Three", " words", " then"], end=STALL)) as server:
        cid = ask(store, queue, "stall", scripted_config(server))
        final, seen = follow(store, cid, timeout_s=20)
    assert final["status"] == "timed_out" and final["live"] is None
    assert ended_within(final)
    cut = steps_of(final, "model")
    assert cut and all(s["outcome"] == "timeout" for s in cut)
    assert cut[0]["partial_text"] == "Three words then" and cut[0]["partial_chars"] == 16
    assert cut[0]["duration_s"] <= cut[0]["timeout_s"] + 1.5  # cut at its timeout, not at the deadline
    assert not any("Three words" in (m.get("content") or "") for m in final["history"])
    assert any(live["text"] == "Three words then" for live in lives(seen))


def test_a_retry_after_a_cut_starts_a_fresh_text_as_attempt_2(store, queue, scripted):
    scripted.add(reply_stream(["Three", " words", " then"], end=STALL),
                 reply_stream(["A fresh", " answer."], pause_s=0.2))
    cid = ask(store, queue, "retry", scripted_config(scripted, job_timeout_s=20, deadline_margin_s=3.0,
                                                     call_timeout_cap_s=2.0))
    final, seen = follow(store, cid)
    assert final["status"] == "done" and final["history"][-1]["content"] == "A fresh answer."
    first, wait, second = final["steps"]
    assert (first["outcome"], first["partial_text"], wait["kind"], second["attempt"]) == (
        "timeout", "Three words then", "retry", 2)
    attempts = [(live["attempt"], live["text"]) for live in lives(seen)]
    assert (2, "A fresh") in attempts or (2, "A fresh answer.") in attempts, attempts
    assert all(text.startswith("A fresh") for attempt, text in attempts if attempt == 2)


def test_an_error_event_mid_stream_keeps_the_text_on_its_step_not_in_the_history(store, queue, scripted):
    scripted.add(reply_stream(["Half an", " answer"], end=ERROR, pause_s=0.2), reply_stream(["Whole."]))
    cid = ask(store, queue, "error", scripted_config(scripted, **LONG))
    final, _ = follow(store, cid)
    broken = steps_of(final, "model")[0]
    assert (broken["outcome"], broken["partial_text"]) == ("error", "Half an answer")
    assert "mid-stream" in broken["detail"]
    assert final["live"] is None
    assert not any("Half an" in (m.get("content") or "") for m in final["history"])


def test_stop_mid_stream_keeps_the_text_marked_stopped_and_answers_every_tool_call(store, queue, scripted):
    scripted.add(chat_reply(None, [tool_call("calculator", {"expression": "17*23"}, "c1")]),
                 reply_stream(["The answer", " is 391"], end=STALL))
    cid = ask(store, queue, "stop me", scripted_config(scripted, **LONG))
    live = wait_for(lambda: (store.read(cid) or {}).get("live"), 15, "the live text")
    assert live["message_index"] == 3  # after the user's message, the call and its result
    wait_for(lambda: (store.read(cid)["live"] or {}).get("text") == "The answer is 391", 15, "the whole live text")
    store.request_cancel(live["turn_id"], ttl_s=60)
    final = wait_done(store, cid, timeout_s=15)
    assert final["status"] == "cancelled" and final["live"] is None
    stopped = steps_of(final, "model")[-1]
    assert (stopped["outcome"], stopped["partial_text"]) == ("stopped", "The answer is 391")
    assert stopped["duration_s"] < LONG["call_timeout_cap_s"]
    called = {c["id"] for m in final["history"] for c in m.get("tool_calls") or []}
    assert called == {m["tool_call_id"] for m in final["history"] if m["role"] == "tool"} == {"c1"}
    assert not any("The answer is" in (m.get("content") or "") for m in final["history"])


def test_two_megabytes_of_text_keep_the_live_text_bounded_like_the_history(store, queue, scripted):
    piece = "0123456789 ünïcödé " * 500  # about 10 KB
    scripted.add(reply_stream([piece] * 200, per_write=20, pause_s=0.1))
    cid = ask(store, queue, "a lot", scripted_config(scripted, **LONG))
    final, seen = follow(store, cid)
    assert final["status"] == "done" and final["live"] is None
    assert max(len(live["text"]) for live in lives(seen)) <= MAX_LIVE_CHARS
    assert final["history"][-1]["content"].startswith((piece * 200)[:MAX_CONTENT_CHARS])
    assert "The reply was cut here" in final["history"][-1]["content"]


def test_safeguards_off_writes_no_live_text_and_shows_nothing_until_the_end(store, queue, scripted):
    scripted.add(reply_stream([f"word{i} " for i in range(20)], pause_s=0.1))
    cid = ask(store, queue, "naive", scripted_config(scripted, safeguards=False, **LONG))
    final, seen = follow(store, cid)
    assert final["status"] == "done" and final["history"][-1]["content"].startswith("word0 ")
    assert lives(seen) == []
    assert final["version"] == 2  # queued, then the one write at the end
