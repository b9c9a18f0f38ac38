"""A model that asks for thousands of tool calls: a bounded number run, the rest are refused in one
record, the deadline is checked before every tool, and the state stays small."""

from __future__ import annotations

import json

import pytest

from agent.turn.response_limits import MAX_TOOL_CALLS_PER_RESPONSE
from tests.conftest import FAST, ask, wait_done
from tests.scripted_server import chat_reply, tool_call
from tests.test_turn import ended_within, scripted_config, steps_of

pytestmark = pytest.mark.usefixtures("pool")

FLOOD_CALLS = 5000
STATE_BOUND_BYTES = 256 * 1024  # a whole flooded turn's state; unbounded it was hundreds of MB


def flood(count: int = FLOOD_CALLS, name: str = "calculator", arguments: dict | None = None):
    arguments = arguments or {"expression": "1+1"}
    return chat_reply(None, [tool_call(name, arguments, f"call_{i}") for i in range(count)])


def state_bytes(state: dict) -> int:
    return len(json.dumps(state).encode())


def test_a_response_with_thousands_of_tool_calls_runs_a_few_and_refuses_the_rest_in_one_step(store, queue, scripted):
    scripted.add(flood(), chat_reply("2, many times"))
    cid = ask(store, queue, "1+1, 5000 times", scripted_config(scripted))
    state = wait_done(store, cid, timeout_s=30)
    assert state["status"] == "done", state["history"][-1]
    assert ended_within(state)
    tools = steps_of(state, "tool")
    assert [t["outcome"] for t in tools] == ["ok"] * MAX_TOOL_CALLS_PER_RESPONSE + ["refused"]
    refused = tools[-1]
    assert refused["refused_calls"] == FLOOD_CALLS - MAX_TOOL_CALLS_PER_RESPONSE
    assert f"{FLOOD_CALLS:,}" in refused["result"] and refused["result"].startswith("Error:")
    # The model got every kept call answered, the refusal included, and nothing more.
    sent = scripted.requests[1].json["messages"]
    call_ids = [c["id"] for c in sent[-MAX_TOOL_CALLS_PER_RESPONSE - 2]["tool_calls"]]
    results = [m for m in sent if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == call_ids == [f"call_{i}" for i in range(len(call_ids))]
    assert len(call_ids) == MAX_TOOL_CALLS_PER_RESPONSE + 1
    assert "refused" in results[-1]["content"]
    assert state_bytes(state) < STATE_BOUND_BYTES


def test_a_model_that_floods_every_response_ends_before_its_deadline_with_a_small_state(store, queue, scripted):
    scripted = type(scripted)(default=flood())
    try:
        cid = ask(store, queue, "flood", scripted_config(scripted, job_timeout_s=10, deadline_margin_s=3.0))
        state = wait_done(store, cid, timeout_s=30)
    finally:
        scripted.stop()
    assert state["done"]
    # The step limit, the deadline, or the last call (sent without tools) once only its time was left.
    assert state["status"] in ("failed", "timed_out", "done")
    if state["status"] == "done":
        assert steps_of(state, "model")[-1]["last_call"]
    assert ended_within(state)
    assert len(steps_of(state, "tool")) <= FAST.max_steps * (MAX_TOOL_CALLS_PER_RESPONSE + 1)
    assert state_bytes(state) < STATE_BOUND_BYTES


def test_no_tool_is_started_once_only_the_last_calls_time_is_left_and_the_calls_left_are_answered_in_one_step(
        store, queue, scripted):
    from agent.deadline import TOOL_CUT_SLACK_S

    # Sixteen one-second waits against a 4 s deadline: about three run, the others are not started,
    # and the last model call (without tools) answers.
    scripted.add(flood(MAX_TOOL_CALLS_PER_RESPONSE, "wait", {"seconds": 1}), chat_reply("answered with what I had"))
    cid = ask(store, queue, "wait a lot", scripted_config(scripted))
    state = wait_done(store, cid, timeout_s=30)
    assert state["status"] == "done", state["history"][-1]
    assert ended_within(state)
    tools = steps_of(state, "tool")
    not_run = [t for t in tools if t["outcome"] == "skipped"]
    assert len(not_run) == 1
    ran = len(tools) - 1
    assert 1 <= ran < MAX_TOOL_CALLS_PER_RESPONSE
    assert not_run[0]["not_run_calls"] == MAX_TOOL_CALLS_PER_RESPONSE - ran
    kept_s = FAST.min_call_s + TOOL_CUT_SLACK_S
    assert all(t["started_at"] + t["timeout_s"] <= state["deadline_at"] - kept_s + 0.01
               for t in tools if t["outcome"] != "skipped"), "every tool's limit left the last call its time"
    # Every call still has an answer in the history, so the next turn can be sent as is.
    assert sum(1 for m in state["history"] if m["role"] == "tool") == MAX_TOOL_CALLS_PER_RESPONSE
    assert state["history"][-1]["content"] == "answered with what I had"
    assert len(scripted.requests) == 2 and not scripted.requests[1].json.get("tools")
