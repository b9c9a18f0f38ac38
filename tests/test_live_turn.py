"""The turn's live text with an in-process model that streams through `on_text`, on a real Redis:
coalesced writes, cut and stopped texts kept on their step (never in the history), fresh retries,
safeguards off writing none, and live writes that never hold the turn."""

from __future__ import annotations

import time

import pytest
import redis

from agent.conversation.store import Store
from agent.providers.base import Completion, ProviderError, ProviderErrorKind, ToolCall
from agent.turn.model_calls import PARTIAL_TEXT_CHARS
from agent.turn.writer import LIVE_WRITE_INTERVAL_S, MAX_LIVE_CHARS
from harness.waiting import wait_for
from tests.conftest import FAST
from tests.test_turn_unit import make_turn

# A few writes beyond one per interval: the first comes at once, and a write may straddle an interval.
EXTRA_WRITES = 3


class StreamingModel:
    """Each call runs the next script: script(on_text, stop) returns a Completion or raises."""

    def __init__(self, *scripts):
        self.scripts = list(scripts)
        self.on_texts = []

    def complete(self, messages, tools, timeout, stop=None, on_text=None):
        self.on_texts.append(on_text)
        return self.scripts.pop(0)(on_text or (lambda delta: None), stop)


@pytest.fixture
def streaming_model(monkeypatch):
    def install(*scripts) -> StreamingModel:
        model = StreamingModel(*scripts)
        monkeypatch.setattr("agent.turn.loop.make_provider", lambda config: model)
        return model

    return install


def answer(text: str):
    def script(on_text, stop):
        for word in text.split(" "):
            on_text(word + " ")
        return Completion(text)

    return script


def live_of(store: Store, cid: str) -> dict | None:
    return store.read(cid)["live"]


def test_a_stream_of_100_000_tiny_chunks_makes_about_one_live_write_per_interval(store, streaming_model):
    timing = {}

    def flood(on_text, stop):
        timing["started"] = time.monotonic()
        for i in range(100_000):
            on_text("x")
            if i % 5_000 == 0:
                time.sleep(0.05)  # a second or so of streaming, whatever the machine's speed
        timing["took_s"] = time.monotonic() - timing["started"]
        return Completion("x" * 100_000)

    streaming_model(flood)
    turn = make_turn(store)
    cid = turn.context.writer.conversation_id
    assert turn.run() == "done"
    state = store.read(cid)
    live_writes = turn.context.writer.live.writes
    assert 1 <= live_writes <= timing["took_s"] / LIVE_WRITE_INTERVAL_S + EXTRA_WRITES, (live_writes, timing)
    # Every write is a version: begin, running, before the call, the live writes, the ending.
    assert state["version"] == 4 + live_writes
    assert state["live"] is None and state["history"][-1]["content"] == "x" * 100_000


def test_the_page_sees_the_text_grow_then_the_message_land_in_the_write_that_clears_it(store, streaming_model):
    seen = {}

    def visible(on_text, stop):
        on_text("Seventeen times ")
        seen["first"] = wait_for(lambda: live_of(store, cid), 5, "the first live write")
        on_text("23 is 391.")
        seen["grown"] = wait_for(lambda: (live_of(store, cid) or {}).get("text") == "Seventeen times 23 is 391.",
                                 5, "the text to grow")
        return Completion("Seventeen times 23 is 391.")

    streaming_model(visible)
    turn = make_turn(store)
    cid = turn.context.writer.conversation_id
    assert turn.run() == "done"
    assert seen["first"] == {"turn_id": turn.context.writer.turn_id, "message_index": 1, "attempt": 1,
                             "text": "Seventeen times ", "status": "writing"}
    state = store.read(cid)
    assert state["live"] is None and state["history"][1] == {"role": "assistant",
                                                             "content": "Seventeen times 23 is 391."}


def test_a_call_cut_after_three_words_keeps_them_on_its_step_and_the_retry_starts_a_fresh_text(
        store, streaming_model):
    seen = {}

    def cut(on_text, stop):
        for word in ("Three", " words", " then"):
            on_text(word)
        wait_for(lambda: (live_of(store, cid) or {}).get("text") == "Three words then", 5, "the live text")
        raise ProviderError(ProviderErrorKind.TIMEOUT, "no reply within 3.0 s")

    def fresh(on_text, stop):
        seen["cleared"] = live_of(store, cid)  # the retry's wait was published: the cut text is gone
        on_text("A fresh")
        seen["fresh"] = wait_for(lambda: live_of(store, cid), 5, "the fresh text")
        return Completion("A fresh answer.")

    streaming_model(cut, fresh)
    turn = make_turn(store)
    cid = turn.context.writer.conversation_id
    assert turn.run() == "done"
    state = store.read(cid)
    first, wait, second = state["steps"]
    assert (first["outcome"], first["attempt"], first["partial_text"], first["partial_chars"]) == (
        "timeout", 1, "Three words then", 16)
    assert wait["kind"] == "retry" and second["attempt"] == 2 and "partial_text" not in second
    assert seen["cleared"] is None
    assert (seen["fresh"]["attempt"], seen["fresh"]["text"], seen["fresh"]["message_index"]) == (2, "A fresh", 1)
    assert [m["content"] for m in state["history"]] == ["hi", "A fresh answer."]
    assert not any("Three words" in (m["content"] or "") for m in state["history"])


def test_an_error_mid_stream_that_ends_the_turn_keeps_the_partial_text_on_the_step_not_in_the_history(
        store, streaming_model):
    def broken(on_text, stop):
        on_text("Half an ans")
        raise ProviderError(ProviderErrorKind.MALFORMED, "the stream broke off: an error event", status=400)

    streaming_model(broken)
    turn = make_turn(store)
    assert turn.run() == "failed"
    state = store.read(turn.context.writer.conversation_id)
    (step,) = state["steps"]
    assert (step["outcome"], step["partial_text"]) == ("error", "Half an ans")
    assert state["live"] is None
    assert "Half an ans" not in str(state["history"])


def test_stop_mid_stream_keeps_the_text_marked_stopped_answers_every_tool_call_and_ends_cancelled(
        store, streaming_model):
    def calls_a_tool(on_text, stop):
        on_text("Let me compute.")
        return Completion("Let me compute.", [ToolCall("c1", "calculator", '{"expression": "17*23"}')])

    def stopped(on_text, stop):
        on_text("The answer is")
        wait_for(lambda: (live_of(store, cid) or {}).get("text") == "The answer is", 5, "the live text")
        store.request_cancel(turn.context.writer.turn_id, ttl_s=60)  # the user's Stop
        assert stop.wait(10), "the stop watch never set the call's stop event"
        raise ProviderError(ProviderErrorKind.STOPPED, "stopped at your request")

    streaming_model(calls_a_tool, stopped)
    turn = make_turn(store)
    cid = turn.context.writer.conversation_id
    assert turn.run() == "cancelled"
    state = store.read(cid)
    model_steps = [s for s in state["steps"] if s["kind"] == "model"]
    assert (model_steps[-1]["outcome"], model_steps[-1]["partial_text"]) == ("stopped", "The answer is")
    assert state["live"] is None and state["status"] == "cancelled"
    called = {c["id"] for m in state["history"] for c in m.get("tool_calls") or []}
    answered = {m["tool_call_id"] for m in state["history"] if m["role"] == "tool"}
    assert called == answered == {"c1"}
    assert not any(m["content"] == "The answer is" for m in state["history"])


def test_a_partial_text_kept_on_a_step_is_bounded_and_says_how_much_arrived(store, streaming_model):
    arrived = MAX_LIVE_CHARS + 50_000

    def long_then_cut(on_text, stop):
        for _ in range(arrived // 100):
            on_text("y" * 100)
        raise ProviderError(ProviderErrorKind.BAD_REQUEST, "refused mid-stream", status=400)

    streaming_model(long_then_cut)
    turn = make_turn(store)
    turn.run()
    (step,) = store.read(turn.context.writer.conversation_id)["steps"]
    assert len(step["partial_text"]) == PARTIAL_TEXT_CHARS and step["partial_chars"] == arrived


def test_safeguards_off_passes_no_on_text_and_writes_no_live_text(store, streaming_model):
    model = streaming_model(answer("Nothing shows until the end."))
    turn = make_turn(store, FAST.with_changes(safeguards=False))
    cid = turn.context.writer.conversation_id
    assert turn.run() == "done"
    assert model.on_texts == [None]
    state = store.read(cid)
    assert state["version"] == 2  # begin, then the one write at the end
    assert state["live"] is None and state["history"][-1]["content"] == "Nothing shows until the end."


class StalledLiveStore(Store):
    """A real store whose live writes stall (a Redis that stopped answering), once or every time."""

    stall_s = 0.0
    failures = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stalling = 0  # live writes that have started
        self.outcomes = []  # what each stalled write came to, once it returned

    def write_live(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise redis.ConnectionError("hiccup")
        self.stalling += 1
        time.sleep(self.stall_s)
        try:
            outcome = super().write_live(*args, **kwargs)
        except Exception as exc:
            self.outcomes.append(getattr(exc, "reason", exc))
            raise
        self.outcomes.append(outcome)
        return outcome


def test_a_live_write_that_fails_is_dropped_and_the_next_carries_the_whole_text(redis_client, streaming_model):
    store = StalledLiveStore(redis_client, ttl_s=600)
    store.failures = 1

    def two_parts(on_text, stop):
        on_text("Lost in a hiccup, ")
        wait_for(lambda: store.failures == 0, 5, "the failed live write")
        on_text("then whole again.")
        wait_for(lambda: (live_of(store, cid) or {}).get("text") == "Lost in a hiccup, then whole again.", 5,
                 "the whole text")
        return Completion("Lost in a hiccup, then whole again.")

    streaming_model(two_parts)
    turn = make_turn(store)
    cid = turn.context.writer.conversation_id
    assert turn.run() == "done"


def test_a_stalled_live_write_never_holds_the_call_or_the_turn(redis_client, streaming_model):
    store = StalledLiveStore(redis_client, ttl_s=600)
    store.stall_s = 5.0
    took = {}

    def quick(on_text, stop):
        started = time.monotonic()
        for _ in range(500):
            on_text("z")
        wait_for(lambda: store.stalling, 5, "a live write to start (and stall)")
        for _ in range(500):
            on_text("z")
        took["s"] = time.monotonic() - started
        return Completion("z" * 1000)

    streaming_model(quick)
    turn = make_turn(store)
    started = time.monotonic()
    assert turn.run() == "done"
    assert time.monotonic() - started < store.stall_s - 1.5
    assert took["s"] < 1.5
    state = store.read(turn.context.writer.conversation_id)
    assert state["history"][-1]["content"] == "z" * 1000
    # The stalled write reaches Redis after the ending: refused, it leaves no live text behind.
    assert wait_for(lambda: store.outcomes, store.stall_s + 5, "the stalled write to return") == ["CLOSED"]
    assert store.read(turn.context.writer.conversation_id)["live"] is None
