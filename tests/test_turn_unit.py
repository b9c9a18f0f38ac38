"""The turn loop with a scripted in-process model: what it sends, what it writes, how it ends."""

from __future__ import annotations

import contextlib
import json
import time

import pytest
import redis
from rq.timeouts import JobTimeoutException

from agent import tools
from agent.conversation.errors import StoreError
from agent.conversation.store import Store
from agent.deadline import Clock
from agent.providers.base import Completion, ProviderError, ProviderErrorKind, ToolCall
from agent.queue import new_id
from agent.turn.loop import Turn
from agent.turn.policies import EAGER_PUBLISHED_TOOLS
from agent.turn.response_limits import MAX_TOOL_CALLS_PER_RESPONSE
from agent.turn.tool_runs import UNRECORDED_START_RESULT
from tests.conftest import FAST
from tests.live_owner import keep_alive


class ScriptedModel:
    """Canned outputs in order; records every call it receives."""

    def __init__(self, *outputs):
        self.outputs = list(outputs)
        self.calls = []

    def complete(self, messages, tools, timeout, stop=None, on_text=None):
        self.calls.append({"messages": list(messages), "tools": tools, "timeout": timeout})
        output = self.outputs.pop(0)
        if isinstance(output, BaseException):
            raise output
        return output


def make_turn(store: Store, config=FAST, started_at: float | None = None, clock: Clock = time.time) -> Turn:
    cid, tid = new_id(), new_id()
    doc = {"status": "queued", "error": None, "config": config.to_dict(), "job_id": "job-" + tid,
           "enqueued_at": time.time()}
    store.begin_turn(cid, tid, {"role": "user", "content": "hi"}, doc)
    # Its job is made up: a live owner keeps the lost-worker checks of the suite's pools (their look for
    # accepted turns whose job is gone) from handing it to a real worker while it runs here.
    keep_alive(store, cid)
    return Turn.create(store, cid, tid, config, started_at=started_at or time.time(),
                       history=[{"role": "user", "content": "hi"}], doc=dict(doc), persisted_len=1, clock=clock)


def stopped_after_its_first_tool(turn: Turn, store: Store) -> Turn:
    """The turn, with a stop requested as soon as its first tool has run (what a user's Stop does)."""
    original = turn.tools.run_tool

    def run_tool_then_stop(call):
        original(call)
        store.request_cancel(turn.context.writer.turn_id, ttl_s=60)

    turn.tools.run_tool = run_tool_then_stop
    return turn


@pytest.fixture
def scripted_model(monkeypatch):
    """Install a ScriptedModel as the provider every Turn builds."""

    def install(*outputs) -> ScriptedModel:
        model = ScriptedModel(*outputs)
        monkeypatch.setattr("agent.turn.loop.make_provider", lambda config: model)
        return model

    return install


def test_the_history_sent_to_the_model_grows_by_each_tool_result(store, scripted_model):
    model = scripted_model(
        Completion(None, [ToolCall("c1", "calculator", '{"expression": "17*23"}')]),
        Completion("391"),
    )
    turn = make_turn(store)
    assert turn.run() == "done"
    second = model.calls[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "c1", "content": "391"}
    state = store.read(turn.context.writer.conversation_id)
    assert state["done"] and state["history"][-1]["content"] == "391"


def test_job_timeout_exception_propagates_after_the_ending_is_written(store, scripted_model):
    scripted_model(JobTimeoutException("the queue's alarm"))
    turn = make_turn(store)
    with pytest.raises(JobTimeoutException):
        turn.run()
    state = store.read(turn.context.writer.conversation_id)
    assert state["done"] and state["status"] == "timed_out"
    assert state["error"]["kind"] == "job_timeout"


def test_a_shutdown_inside_a_call_that_cannot_be_handed_over_ends_saying_the_app_was_stopped(store, scripted_model):
    scripted_model(SystemExit(1))
    turn = make_turn(store)  # run by no queued job: nothing for the app's next start to continue
    with pytest.raises(SystemExit):
        turn.run()
    state = store.read(turn.context.writer.conversation_id)
    assert state["status"] == "failed", "not a person's Stop"  # handed over when it can be: test_shutdown_handover.py
    assert state["error"]["kind"] == "shutdown" and state["error"]["message"].startswith("The app was stopped")


def test_an_unexpected_error_ends_the_turn_failed_with_a_readable_message(store, scripted_model):
    scripted_model(KeyError("boom"))
    turn = make_turn(store)
    assert turn.run() == "failed"
    state = store.read(turn.context.writer.conversation_id)
    assert "Something went wrong" in state["history"][-1]["content"]


class FlakyStore(Store):
    """A real store whose next `failures` publishes fail like a Redis hiccup."""

    failures = 0

    def publish(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise redis.ConnectionError("hiccup")
        return super().publish(*args, **kwargs)


def test_the_final_write_is_retried_when_redis_hiccups(redis_client, scripted_model):
    store = FlakyStore(redis_client, ttl_s=600)
    scripted_model(Completion("hello"))
    turn = make_turn(store)
    store.failures = 4  # the in-loop writes and the first tries of the final write fail
    assert turn.run() == "done"
    state = store.read(turn.context.writer.conversation_id)
    assert state["done"]
    # Nothing was lost: the answer written late is still there, once.
    assert [m["content"] for m in state["history"]] == ["hi", "hello"]


def test_a_mid_turn_write_failure_keeps_the_messages_for_the_next_write(redis_client, scripted_model):
    store = FlakyStore(redis_client, ttl_s=600)
    scripted_model(Completion(None, [ToolCall("c1", "calculator", '{"expression": "2+2"}')]), Completion("4"))
    turn = make_turn(store)
    store.failures = 2
    turn.run()
    history = store.read(turn.context.writer.conversation_id)["history"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]


def test_a_turn_ended_elsewhere_stops_without_writing(store, scripted_model):
    from agent.conversation.endings import Ending, write_ending

    scripted_model(Completion(None, [ToolCall("c1", "calculator", '{"expression": "2+2"}')]),
                          Completion("4"))
    turn = make_turn(store)
    writer = turn.context.writer
    assert write_ending(store, writer.conversation_id, writer.turn_id, Ending("failed", "worker_lost", "lost"))
    assert turn.run() == "closed"
    state = store.read(turn.context.writer.conversation_id)
    assert state["status"] == "failed" and state["history"][-1]["content"] == "lost"


def test_a_non_retryable_error_is_not_retried(store, scripted_model):
    rejected = ProviderError(ProviderErrorKind.AUTH, "the API key was rejected (HTTP 401)", status=401)
    model = scripted_model(rejected, Completion("no"))
    turn = make_turn(store)
    assert turn.run() == "failed"
    assert len(model.calls) == 1
    assert "API key was rejected" in store.read(turn.context.writer.conversation_id)["history"][-1]["content"]


def test_a_stop_request_ends_the_turn_cancelled_keeping_what_was_done(store, scripted_model):
    model = scripted_model(
        Completion(None, [ToolCall("c1", "calculator", '{"expression": "2+2"}')]),
        Completion("never sent"),
    )
    turn = stopped_after_its_first_tool(make_turn(store), store)
    assert turn.run() == "cancelled"
    state = store.read(turn.context.writer.conversation_id)
    assert [m["role"] for m in state["history"]] == ["user", "assistant", "tool", "assistant"]
    assert state["history"][-1]["content"] == "Stopped at your request."
    assert len(model.calls) == 1


class RecordingStore(Store):
    """A real store that records what each publish carried."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.writes: list[dict] = []

    def publish(self, conversation_id, turn_id, doc, **kwargs):
        self.writes.append({"doc": json.loads(json.dumps(doc)), "steps": list(kwargs.get("new_steps") or ())})
        return super().publish(conversation_id, turn_id, doc, **kwargs)


def calculator_calls(count: int) -> Completion:
    return Completion(None, [ToolCall(f"c{i}", "calculator", '{"expression": "2+2"}') for i in range(count)])


def tool_writes(store: RecordingStore) -> list[list[str]]:
    return [[s["name"] for s in w["steps"] if s["kind"] == "tool"] for w in store.writes
            if any(s["kind"] == "tool" for s in w["steps"])]


def frozen_clock() -> Clock:
    """Time stands still for the turn's own clock: only the number of tools decides when it writes."""
    now = time.time()
    return lambda: now + 0.1


def test_each_of_a_few_quick_tools_is_published_as_it_lands(redis_client, scripted_model):
    store = RecordingStore(redis_client, ttl_s=600)
    scripted_model(calculator_calls(2), Completion("4 and 4"))
    turn = make_turn(store, clock=frozen_clock())
    assert turn.run() == "done"
    assert tool_writes(store) == [["calculator"], ["calculator"]]


def test_many_quick_tools_in_one_response_are_published_in_batches(redis_client, scripted_model):
    store = RecordingStore(redis_client, ttl_s=600)
    scripted_model(calculator_calls(MAX_TOOL_CALLS_PER_RESPONSE), Completion("all 4"))
    turn = make_turn(store, clock=frozen_clock())
    assert turn.run() == "done"
    writes = tool_writes(store)
    assert sum(len(w) for w in writes) == MAX_TOOL_CALLS_PER_RESPONSE  # every step lands, once
    assert len(writes) == EAGER_PUBLISHED_TOOLS + 1  # the first few one by one, then the rest in one write


def test_while_a_slow_tool_runs_it_is_shown_running_with_the_results_before_it(redis_client, scripted_model):
    store = RecordingStore(redis_client, ttl_s=600)
    quick = [ToolCall(f"c{i}", "calculator", '{"expression": "2+2"}') for i in range(EAGER_PUBLISHED_TOOLS + 2)]
    scripted_model(Completion(None, [*quick, ToolCall("w", "wait", '{"seconds": 0.6}')]), Completion("done"))
    turn = make_turn(store)
    assert turn.run() == "done"
    running = next(w for w in store.writes if (w["doc"].get("current_step") or {}).get("name") == "wait")
    written_before = [s["name"] for w in store.writes[: store.writes.index(running) + 1] for s in w["steps"]]
    assert written_before.count("calculator") == len(quick)
    assert "wait" not in written_before


def test_a_turn_records_a_bounded_number_of_steps_whatever_its_step_limit(store, scripted_model, monkeypatch):
    monkeypatch.setattr("agent.turn.loop.MAX_RECORDED_STEPS", 10)
    scripted_model(*[calculator_calls(1)] * 100)
    turn = make_turn(store, FAST.with_changes(max_steps=100, job_timeout_s=60))
    assert turn.run() == "failed"
    state = store.read(turn.context.writer.conversation_id)
    assert state["error"]["kind"] == "step_limit"
    assert 10 <= len(state["steps"]) <= 10 + 2
    assert "the most one turn may record" in state["history"][-1]["content"]


def test_tools_that_would_leave_no_time_to_answer_are_not_run_and_the_last_call_answers(store, scripted_model):
    from agent.turn.tool_runs import NOT_RUN_RESULT

    model = scripted_model(
        Completion(None, [ToolCall("c1", "calculator", '{"expression": "1+1"}'),
                          ToolCall("c2", "calculator", '{"expression": "2+2"}')]),
        Completion("Here is what I have."),
    )
    deadline_s = FAST.job_timeout_s - FAST.deadline_margin_s
    # 0.6 s left: a model call fits (its minimum is 0.5 s), but not a tool and a call after it. The turn's
    # clock stands still, so a busy machine cannot spend those 0.1 s before the call starts.
    now = time.time()
    turn = make_turn(store, started_at=now - (deadline_s - FAST.min_call_s - 0.1), clock=lambda: now)
    assert turn.run() == "done"
    assert model.calls[1]["tools"] == [], "the last call goes without tools"
    state = store.read(turn.context.writer.conversation_id)
    results = [m for m in state["history"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [("c1", NOT_RUN_RESULT), ("c2", NOT_RUN_RESULT)]
    (not_run,) = [s for s in state["steps"] if s["kind"] == "tool"]
    assert not_run["outcome"] == "skipped" and not_run["not_run_calls"] == 2
    assert state["history"][-1] == {"role": "assistant", "content": "Here is what I have."}


class _StoppedWhile:
    """A provider whose call is stopped after writing `text` (nothing: while waiting for its reply)."""

    def __init__(self, text: str):
        self.text = text

    def complete(self, messages, tools, timeout, stop=None, on_text=None):
        if self.text and on_text is not None:
            on_text(self.text)
        raise ProviderError(ProviderErrorKind.STOPPED, "stopped at your request")


@pytest.mark.parametrize(("written", "said"), [
    ("", "while waiting for the model's reply"),
    ("The answer is", "while the model was writing its reply (13 characters written"),
])
def test_a_stop_notice_names_what_the_model_call_was_doing(store, monkeypatch, written, said):
    """A regression: a stop while the reply was being written said "while waiting for the model's reply"."""
    monkeypatch.setattr("agent.turn.loop.make_provider", lambda config: _StoppedWhile(written))
    turn = make_turn(store)
    assert turn.run() == "cancelled"
    ending = store.read(turn.context.writer.conversation_id)["history"][-1]["content"]
    assert ending.startswith("Stopped at your request, " + said), ending


def test_a_stop_during_a_retry_wait_says_it_came_while_waiting_to_try_again(store, monkeypatch):
    flaky = ScriptedModel(ProviderError(ProviderErrorKind.SERVER, "HTTP 503", status=503, retry_after_s=2.0))
    monkeypatch.setattr("agent.turn.loop.make_provider", lambda config: flaky)
    turn = make_turn(store)
    original = turn.context.stops.sleep

    def stop_then_sleep(seconds):
        store.request_cancel(turn.context.writer.turn_id, ttl_s=60)
        original(seconds)

    turn.context.stops.sleep = stop_then_sleep
    assert turn.run() == "cancelled"
    ending = store.read(turn.context.writer.conversation_id)["history"][-1]["content"]
    assert ending == "Stopped at your request, while waiting 2.0 s before trying the model call again."


def test_a_tool_not_safe_to_repeat_starts_only_once_its_start_and_every_result_before_it_are_stored(
        redis_client, scripted_model):
    # Mixed with quick tools that are safe to repeat (batched), each side-effecting call finds, in Redis,
    # its own call id as the running step and a result for every call before it: a resume after a loss at
    # any point knows the one call that may have taken effect.
    store = RecordingStore(redis_client, ttl_s=600)
    seen: list[tuple[str, dict]] = []

    def effect(n: int, *, idempotency_key: str) -> str:
        """Not safe to repeat."""
        state = store.read(turn.context.writer.conversation_id)
        seen.append((idempotency_key, state))
        return f"effect {n}"

    tools.tool(effect, source="tests")
    try:
        calls = [ToolCall(f"c{i}", "calculator", '{"expression": "2+2"}') if i % 3 else
                 ToolCall(f"e{i}", "effect", json.dumps({"n": i})) for i in range(12)]
        scripted_model(Completion(None, calls), Completion("done"))
        turn = make_turn(store, clock=frozen_clock())
        assert turn.run() == "done"
    finally:
        tools.REGISTRY.pop("effect", None)
    turn_id = turn.context.writer.turn_id
    assert [key for key, _ in seen] == [f"{turn_id}:e{i}" for i in range(0, 12, 3)]
    for key, state in seen:
        call_id = key.split(":")[1]
        assert state["current_step"]["call_id"] == call_id, state["current_step"]
        before = [c.id for c in calls[: [c.id for c in calls].index(call_id)]]
        stored = [m["tool_call_id"] for m in state["history"] if m["role"] == "tool"]
        assert stored == before, (call_id, stored)


def test_a_tool_not_safe_to_repeat_is_not_run_when_its_start_cannot_be_stored(redis_client, scripted_model):
    ran = []

    class StartRefused(RecordingStore):
        def publish(self, conversation_id, turn_id, doc, **kwargs):
            if (doc.get("current_step") or {}).get("name") == "effect":
                raise redis.ConnectionError("Redis went away")
            return super().publish(conversation_id, turn_id, doc, **kwargs)

    def effect(*, idempotency_key: str) -> str:
        """Not safe to repeat."""
        ran.append(idempotency_key)
        return "done it"

    tools.tool(effect, source="tests")
    try:
        store = StartRefused(redis_client, ttl_s=600)
        model = scripted_model(Completion(None, [ToolCall("e1", "effect", "{}")]), Completion("could not"))
        turn = make_turn(store)
        assert turn.run() == "done"
    finally:
        tools.REGISTRY.pop("effect", None)
    assert ran == []
    sent = [m for m in model.calls[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in sent] == [UNRECORDED_START_RESULT]


class RunTwice(RecordingStore):
    """A store whose every write before the ending runs twice, as redis-py's retry runs a write that timed
    out but ran: the caller sees the second run's outcome."""

    def publish(self, conversation_id, turn_id, doc, **kwargs):
        if kwargs.get("done"):
            return super().publish(conversation_id, turn_id, doc, **kwargs)
        with contextlib.suppress(StoreError):
            super().publish(conversation_id, turn_id, doc, **kwargs)
        return super().publish(conversation_id, turn_id, doc, **kwargs)


def test_a_write_run_twice_records_no_message_or_step_twice(redis_client, scripted_model):
    # Every write lands twice: one with messages is refused the second time (the history moved) and
    # reconciled; one with steps alone (a resume step, a retry) is stored once by the script itself.
    store = RunTwice(redis_client, ttl_s=600)
    scripted_model(Completion(None, [ToolCall(f"c{i}", "calculator", '{"expression": "2+2"}') for i in range(6)]),
                   Completion("4 each"))
    turn = make_turn(store, clock=frozen_clock())
    turn.context.writer.writer_job = turn.context.writer.live.writer_job = "job-1"
    store.redis.hset(f"agent:conv:{turn.context.writer.conversation_id}:meta", "writer", "job-1")
    turn.context.writer.add_step("retry", "a step alone", time.time(), "ok")
    turn.context.writer.flush()
    assert turn.run() == "done"
    state = store.read(turn.context.writer.conversation_id)
    indexes = [s["index"] for s in state["steps"]]
    assert indexes == sorted(set(indexes)), indexes
    assert [m["role"] for m in state["history"]].count("tool") == 6
    assert len(state["history"]) == len({json.dumps(m, sort_keys=True) for m in state["history"]})
