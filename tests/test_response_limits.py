"""What one model response may bring into a turn (agent/turn/response_limits.py): pure, no I/O."""

from __future__ import annotations

import json

import pytest

from agent.providers.base import Completion, ToolCall
from agent.turn.response_limits import (
    MAX_ARGUMENTS_CHARS,
    MAX_CONTENT_CHARS,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_TOOL_CALLS_PER_RESPONSE,
    bound_response,
)


def calls(count: int) -> list[ToolCall]:
    return [ToolCall(f"c{i}", "calculator", '{"expression": "1+1"}') for i in range(count)]


def test_a_response_within_the_limits_is_kept_as_it_is():
    completion = Completion("hello", calls(MAX_TOOL_CALLS_PER_RESPONSE))
    bounded = bound_response(completion)
    assert bounded.completion == completion
    assert all(p.refusal is None for p in bounded.calls)


def test_one_call_past_the_limit_is_kept_as_the_record_of_its_own_refusal():
    bounded = bound_response(Completion(None, calls(MAX_TOOL_CALLS_PER_RESPONSE + 1)))
    assert len(bounded.completion.tool_calls) == MAX_TOOL_CALLS_PER_RESPONSE + 1
    record = bounded.calls[-1]
    assert record.refused_calls == 1
    assert record.refusal.startswith("Error: refused") and "this call was not run" in record.refusal


def test_sixty_thousand_calls_keep_one_more_than_the_limit_and_the_record_counts_the_rest():
    bounded = bound_response(Completion(None, calls(60_000)))
    assert [c.id for c in bounded.completion.tool_calls] == [f"c{i}" for i in range(MAX_TOOL_CALLS_PER_RESPONSE + 1)]
    record = bounded.calls[-1]
    assert record.refused_calls == 60_000 - MAX_TOOL_CALLS_PER_RESPONSE
    assert "60,000 tool calls" in record.refusal and "59,983 after it" in record.refusal
    assert [p.refusal is None for p in bounded.calls].count(True) == MAX_TOOL_CALLS_PER_RESPONSE


def test_a_reply_longer_than_the_limit_is_cut_and_says_so():
    bounded = bound_response(Completion("x" * (MAX_CONTENT_CHARS * 3)))
    content = bounded.completion.content
    assert content.startswith("x" * MAX_CONTENT_CHARS)
    assert len(content) < MAX_CONTENT_CHARS + 200
    assert f"{MAX_CONTENT_CHARS * 3:,} characters" in content


def test_arguments_longer_than_the_limit_are_refused_and_not_kept():
    huge = json.dumps({"expression": "1+" * MAX_ARGUMENTS_CHARS + "1"})
    bounded = bound_response(Completion(None, [ToolCall("c1", "calculator", huge)]))
    (planned,) = bounded.calls
    assert planned.refusal.startswith("Error: the arguments are too long")
    assert planned.call.arguments == "{}"  # still valid JSON, so the history can be sent back


def test_an_overlong_id_or_name_is_cut():
    bounded = bound_response(Completion(None, [ToolCall("i" * 10_000, "n" * 10_000, "{}")]))
    call = bounded.completion.tool_calls[0]
    assert call.id == "i" * MAX_ID_CHARS and call.name == "n" * MAX_NAME_CHARS
    assert bounded.calls[0].call == call


def ids_and_refusals(bounded) -> list[tuple[str, bool]]:
    return [(p.call.id, p.refusal is not None) for p in bounded.calls]


@pytest.mark.parametrize(("ids", "used", "expected"), [
    (["a", "a"], (), [("a", False), ("a_2", True)]),  # repeated within one reply
    (["a", "b", "a", "a"], (), [("a", False), ("b", False), ("a_2", True), ("a_3", True)]),
    (["a"], ("a",), [("a_2", False)]),  # used earlier in the turn: a new request, under a fresh id
    (["a", "a"], ("a",), [("a_2", False), ("a_3", True)]),  # ... repeated within the reply too
    (["a", "a_2"], ("a",), [("a_3", False), ("a_2", False)]),  # a fresh id never takes one the reply has
    (["", ""], (), [("call_2", False), ("call_3", False)]),  # no id at all: each runs, under an id of its own
])
def test_every_kept_call_has_an_id_of_its_own_and_a_repeated_id_runs_once(ids, used, expected):
    bounded = bound_response(Completion(None, [ToolCall(i, "calculator", '{"expression": "1+1"}') for i in ids]),
                             used_ids=set(used))
    assert ids_and_refusals(bounded) == expected
    kept = [c.id for c in bounded.completion.tool_calls]
    assert len(set(kept)) == len(kept) and not set(kept) & set(used)
    for planned in bounded.calls:
        if planned.refusal and planned.call.id != "":
            assert "repeated the id" in planned.refusal


def test_the_record_of_a_refusal_by_count_gets_an_id_of_its_own_too():
    same = [ToolCall("x", "calculator", '{"expression": "1+1"}')] * (MAX_TOOL_CALLS_PER_RESPONSE + 5)
    bounded = bound_response(Completion(None, same))
    kept = [c.id for c in bounded.completion.tool_calls]
    assert len(set(kept)) == len(kept) == MAX_TOOL_CALLS_PER_RESPONSE + 1
    assert [p.refusal is None for p in bounded.calls].count(True) == 1
    assert bounded.calls[-1].refused_calls == 5 and "21 tool calls" in bounded.calls[-1].refusal
