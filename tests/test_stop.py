"""Stop ends the running step (a hung model call, the `wait` tool) within about a second, and the
step is recorded as stopped. Real workers, real Redis, real HTTP servers."""

from __future__ import annotations

import threading
import time

import pytest

from agent.conversation.store import Store
from agent.deadline import CallTimeout
from agent.providers.base import Completion, ProviderError, ToolCall
from agent.providers.http import post_json
from agent.providers.retry import RETRY_POLICY
from agent.runtime.loopback_server import hang
from agent.tools import REGISTRY, make_tool, run_tool
from agent.turn.stop_watch import StopWatch
from agent.turn.tool_runs import UNANSWERED_CALL_RESULT
from tests.conftest import FAST, ask, wait_done
from tests.test_turn import scripted_config, steps_of
from tests.test_turn_unit import make_turn, stopped_after_its_first_tool

# From the request to the final write. The aim is about one second; the bound leaves room for a
# busy machine and stays far below the 20 s call cap that would end the step without a stop.
STOP_BOUND_S = 6.0
# Clocks long enough that only Stop can end the step early: a 25 s deadline, 20 s per call.
LONG = dict(job_timeout_s=30, deadline_margin_s=5.0, call_timeout_cap_s=20.0)


def wait_for_state(store: Store, cid: str, predicate, timeout_s: float = 15.0) -> dict:
    """The first state that satisfies `predicate`; fails the test if none comes."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        state = store.read(cid)
        if state and predicate(state):
            return state
        assert not (state and state["done"]), f"the turn ended first: {state['history'][-1]}"
        time.sleep(0.02)
    raise AssertionError(f"no such state within {timeout_s} s: {store.read(cid)}")


def running(kind: str, name: str | None = None):
    def check(state: dict) -> bool:
        current = state.get("current_step") or {}
        return current.get("kind") == kind and (name is None or current.get("name") == name)

    return check


def stop_and_time(store: Store, cid: str, turn_id: str) -> tuple[dict, float]:
    asked = time.monotonic()
    store.request_cancel(turn_id, ttl_s=60)
    state = wait_done(store, cid, timeout_s=30)
    return state, time.monotonic() - asked


@pytest.mark.usefixtures("pool")
class TestStopEndsTheRunningStep:
    def test_stop_during_a_hung_model_call_ends_the_turn_within_a_second(self, store, queue):
        cid = ask(store, queue, "hello", FAST.with_changes(model="demo:hang", **LONG))
        state = wait_for_state(store, cid, running("model"))
        state, took_s = stop_and_time(store, cid, state["turn_id"])
        assert took_s < STOP_BOUND_S
        assert state["status"] == "cancelled"
        model = steps_of(state, "model")[-1]
        assert model["outcome"] == "stopped"
        assert model["duration_s"] < LONG["call_timeout_cap_s"]
        ending = state["history"][-1]["content"]
        assert ending.startswith("Stopped at your request") and "model" in ending

    def test_stop_during_the_wait_tool_ends_it_within_a_second(self, store, queue):
        cid = ask(store, queue, "hi", FAST.with_changes(model="demo:slow-tool", **LONG))
        state = wait_for_state(store, cid, running("tool", "wait"))
        state, took_s = stop_and_time(store, cid, state["turn_id"])
        assert took_s < STOP_BOUND_S
        assert state["status"] == "cancelled"
        wait_step = next(s for s in steps_of(state, "tool") if s["name"] == "wait")
        assert wait_step["outcome"] == "stopped", (wait_step, state["history"])
        assert "stopped at your request" in wait_step["result"]
        # The ending agrees with the tool's own result: the wait was cut, not finished.
        tool_message = next(m for m in state["history"] if m["role"] == "tool")
        assert tool_message["content"] == wait_step["result"]
        ending = state["history"][-1]["content"]
        assert ending.startswith("Stopped at your request") and "cut short" in ending

    def test_with_safeguards_off_stop_ends_a_hung_call_too(self, store, queue, scripted):
        scripted.add(hang())
        cid = ask(store, queue, "hello", scripted_config(scripted, safeguards=False, **LONG))
        scripted.wait_for_requests(1, timeout_s=15)
        state, took_s = stop_and_time(store, cid, store.read_meta(cid)["turn_id"])
        assert took_s < STOP_BOUND_S
        assert state["status"] == "cancelled"
        assert steps_of(state, "model")[-1]["outcome"] == "stopped"


def test_a_call_whose_stop_event_is_set_ends_at_once_as_stopped_and_is_not_retried(scripted):
    scripted.add(hang())
    stop = threading.Event()
    released = threading.Event()

    def stop_once_the_request_arrived():
        scripted.wait_for_requests(1, timeout_s=10)
        stop.set()
        released.set()

    threading.Thread(target=stop_once_the_request_arrived, daemon=True).start()
    with pytest.raises(ProviderError) as caught:
        post_json(scripted.url + "/v1/chat/completions", headers={}, body={},
                  timeout=CallTimeout(total_s=30.0, connect_s=5.0), stop=stop)
    assert released.is_set()
    assert caught.value.kind == "stopped"
    assert not RETRY_POLICY.retryable(caught.value)


def test_a_call_whose_stop_event_is_already_set_is_not_made(scripted):
    stop = threading.Event()
    stop.set()
    with pytest.raises(ProviderError) as caught:
        post_json(scripted.url + "/v1/chat/completions", headers={}, body={},
                  timeout=CallTimeout(total_s=30.0, connect_s=5.0), stop=stop)
    assert caught.value.kind == "stopped"
    assert scripted.requests == []


def _sleepy(seconds: float) -> str:
    """Sleep, ignoring any stop request."""
    time.sleep(seconds)
    return "slept"


def test_the_wait_tool_returns_its_own_account_when_stopped():
    stop = threading.Event()
    result = run_tool("wait", '{"seconds": 30}', 60, stop=stop, heartbeat=stop.set)
    assert result.stopped and result.ok
    assert result.output.startswith("Waited 0.") and result.output.endswith("stopped at your request")


def test_a_tool_that_ignores_stop_is_abandoned_with_an_error_that_says_so(monkeypatch):
    monkeypatch.setitem(REGISTRY, "sleepy", make_tool(_sleepy))
    stop = threading.Event()
    result = run_tool("sleepy", '{"seconds": 30}', 60, stop=stop, heartbeat=stop.set)
    assert result.stopped and not result.ok
    assert result.output.startswith("Error: stopped at your request after")
    assert result.output.endswith("before sleepy finished")
    assert result.duration_s < 30


def test_every_call_left_when_a_stop_comes_between_tools_still_gets_a_result(store, monkeypatch):
    calls = [ToolCall(f"c{i}", "calculator", '{"expression": "2+2"}') for i in range(3)]
    monkeypatch.setattr("agent.turn.loop.make_provider", lambda config: _Once(Completion(None, calls)))
    turn = stopped_after_its_first_tool(make_turn(store), store)
    assert turn.run() == "cancelled"
    history = store.read(turn.context.writer.conversation_id)["history"]
    results = {m["tool_call_id"]: m["content"] for m in history if m["role"] == "tool"}
    assert results == {"c0": "4", "c1": UNANSWERED_CALL_RESULT, "c2": UNANSWERED_CALL_RESULT}
    assert history[-1]["content"] == "Stopped at your request."


class _Once:
    def __init__(self, completion):
        self.completion = completion

    def complete(self, messages, tools, timeout, stop=None, on_text=None):
        return self.completion


def test_the_stop_watch_sets_its_event_once_the_flag_is_seen_and_survives_failed_checks():
    answers = iter([ConnectionError("redis hiccup"), False, True])

    def requested() -> bool:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with StopWatch(requested, interval_s=0.01) as watch:
        assert watch.event.wait(10)
