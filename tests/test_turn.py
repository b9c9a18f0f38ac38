"""The turn loop under the three clocks: real Redis, real RQ workers, real HTTP servers."""

from __future__ import annotations

import json
import time
import zlib

import pytest
from rq.serializers import JSONSerializer

from agent.conversation.errors import TurnInFlight
from agent.queue import SafeJob, job_id_for, submit_turn
from agent.runtime.loopback_server import delayed, hang, reply, trickle
from agent.settings import DEFAULT_STATE_TTL_S
from harness.waiting import wait_for
from tests.conftest import CANARY_KEY, FAST, ask, redis_dump, wait_done
from tests.scripted_server import chat_reply, tool_call

pytestmark = pytest.mark.usefixtures("pool")


def scripted_config(server, **changes):
    return FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1", **changes)


def ended_within(state: dict, seconds_after_deadline: float = 1.5) -> bool:
    return state["updated_at"] <= state["deadline_at"] + seconds_after_deadline


def wait_job_ended(connection, job_id: str, timeout_s: float = 20.0) -> str:
    """RQ's status for a job once it has ended (finished, failed, stopped); fails the test if it never does."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        job = SafeJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
        status = job.get_status(refresh=False).value
        if status in ("finished", "failed", "stopped", "canceled"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end within {timeout_s} s: {status}")


def steps_of(state, kind):
    return [s for s in state["steps"] if s["kind"] == kind]


def test_a_question_is_answered_through_the_calculator_on_the_demo_provider(store, queue):
    cid = ask(store, queue, "What is 17*23?")
    state = wait_done(store, cid)
    assert state["status"] == "done"
    assert state["error"] is None
    assert "391" in state["history"][-1]["content"]
    tools = steps_of(state, "tool")
    assert [t["name"] for t in tools] == ["calculator"]
    assert tools[0]["result"] == "391"


def test_state_is_published_after_every_round_trip_with_versions_going_up_by_one(store, queue):
    seen = []
    # One-second model calls: a client on a busy machine still sees the states between them.
    cid = ask(store, queue, "What is 17*23, and what time is it in Tokyo?",
              FAST.with_changes(model="demo@1.0~0", job_timeout_s=14, deadline_margin_s=2.0))
    final = wait_done(store, cid, timeout_s=40, on_state=seen.append)
    versions = [s["version"] for s in seen]
    assert versions == sorted(set(versions))
    # A client polling every 50 ms sees the first tool result before the final answer.
    first_tool_seen = next(s for s in seen if any(m["role"] == "tool" for m in s["history"]))
    assert not first_tool_seen["done"]
    assert [s["done"] for s in seen].count(True) == 1 and seen[-1]["done"]
    # Every write leaves one more version; none are skipped by the writer.
    assert final["version"] >= 1 + 2 * 3  # queued + (model, tool) x2 + model + final
    ttl = store.redis.ttl(f"agent:conv:{cid}:meta")
    assert DEFAULT_STATE_TTL_S - 10 <= ttl <= DEFAULT_STATE_TTL_S  # the workers' AGENT_STATE_TTL: the default


def test_a_provider_that_hangs_ends_timed_out_by_the_deadline(store, queue):
    started = time.time()
    cid = ask(store, queue, "hello", FAST.with_changes(model="demo:hang"))
    state = wait_done(store, cid, timeout_s=15)
    assert state["status"] == "timed_out"
    assert state["done"]
    assert ended_within(state)
    assert state["updated_at"] < state["job_timeout_at"]
    assert started <= state["started_at"] and state["updated_at"] - state["started_at"] < FAST.job_timeout_s
    assert state["history"][-1]["role"] == "assistant"
    assert "time" in state["history"][-1]["content"].lower()


def test_a_trickling_body_ends_at_the_calls_timeout(store, queue, scripted):
    body = chat_reply("never finished").body
    scripted.add(trickle(body, bytes_per_second=2))
    scripted.add(hang())
    config = scripted_config(scripted, call_timeout_cap_s=1.5)
    cid = ask(store, queue, "hi", config)
    state = wait_done(store, cid, timeout_s=15)
    first = steps_of(state, "model")[0]
    assert first["outcome"] == "timeout"
    assert first["timeout_s"] == pytest.approx(1.5)
    assert 1.0 <= first["duration_s"] <= 2.6
    assert state["status"] == "timed_out"
    assert ended_within(state)


def test_a_late_calls_timeout_equals_what_remains_not_the_cap(store, queue, scripted):
    # The first call takes 2.5 s of a 4 s deadline; the second gets what remains (~1.5 s), not the 3 s cap.
    scripted.add(delayed(2.5, chat_reply(None, [tool_call("calculator", {"expression": "1+1"})])))
    scripted.add(chat_reply("2"))
    cid = ask(store, queue, "1+1?", scripted_config(scripted))
    state = wait_done(store, cid)
    model_steps = steps_of(state, "model")
    assert model_steps[0]["timeout_s"] == pytest.approx(3.0)
    second = model_steps[1]
    assert second["timeout_s"] < 2.0
    assert second["timeout_s"] == pytest.approx(second["remaining_s"], abs=0.01)
    assert state["status"] == "done"


def test_a_first_call_leaving_less_than_the_minimum_skips_the_next_call_and_records_the_skip(store, queue, scripted):
    slow = chat_reply(None, [tool_call("calculator", {"expression": "2*2"})])
    scripted.add(delayed(2.9, slow))
    config = scripted_config(scripted, min_call_s=1.5)
    cid = ask(store, queue, "2*2?", config)
    state = wait_done(store, cid)
    skips = steps_of(state, "skip")
    assert len(skips) == 1
    assert skips[0]["outcome"] == "skipped"
    assert skips[0]["remaining_s"] < 1.5
    assert len(scripted.requests) == 1
    assert state["status"] == "timed_out"
    assert "ran out of time" in state["history"][-1]["content"]


def test_429_with_retry_after_is_retried_after_the_wait(store, queue, scripted):
    scripted.add(reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "1"}))
    scripted.add(chat_reply("hello after the wait"))
    config = scripted_config(scripted, job_timeout_s=8)
    cid = ask(store, queue, "hi", config)
    state = wait_done(store, cid)
    assert state["status"] == "done"
    first, second = scripted.requests[:2]
    assert second.received_at - first.received_at >= 0.9
    retry = steps_of(state, "retry")[0]
    assert retry["timeout_s"] == pytest.approx(1.0)
    assert "Retry-After" in retry["detail"]


def test_a_retry_after_longer_than_the_budget_ends_the_turn_as_rate_limited(store, queue, scripted):
    scripted.add(reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "30"}))
    cid = ask(store, queue, "hi", scripted_config(scripted))
    state = wait_done(store, cid)
    assert not steps_of(state, "retry")  # ended at once: no wait for a retry that cannot fit
    assert ended_within(state)
    assert state["status"] == "failed"
    assert state["error"]["kind"] == "rate_limited"
    assert "rate-limiting" in state["history"][-1]["content"]
    assert len(scripted.requests) == 1


def test_401_is_not_retried_and_the_ending_says_the_key_was_rejected(store, queue, scripted):
    scripted.add(reply(401, {"error": {"message": "Incorrect API key provided"}}))
    cid = ask(store, queue, "hi", scripted_config(scripted))
    state = wait_done(store, cid)
    assert state["status"] == "failed"
    assert "API key was rejected" in state["history"][-1]["content"]
    time.sleep(0.3)
    assert len(scripted.requests) == 1


def test_a_malformed_body_ends_the_turn_with_a_clear_failure(store, queue, scripted):
    scripted.add(reply(200, None, body=b'{"choices": [ {"message": '))
    cid = ask(store, queue, "hi", scripted_config(scripted))
    state = wait_done(store, cid)
    assert state["status"] == "failed"
    assert "malformed" in state["history"][-1]["content"]


def test_endless_tool_calls_are_stopped_by_the_step_limit(store, queue):
    cid = ask(store, queue, "hi", FAST.with_changes(model="demo:loop", max_steps=3, job_timeout_s=10))
    state = wait_done(store, cid)
    assert len(steps_of(state, "model")) == 3
    assert state["status"] == "failed"
    assert state["error"]["kind"] == "step_limit"
    assert "3 model round-trips" in state["history"][-1]["content"]


def test_a_tool_error_goes_back_to_the_model_as_the_tool_result(store, queue, scripted):
    scripted.add(chat_reply(None, [tool_call("calculator", {"expression": "__import__('os')"})]))
    scripted.add(chat_reply("that did not work"))
    cid = ask(store, queue, "hi", scripted_config(scripted))
    state = wait_done(store, cid)
    assert state["status"] == "done"
    tool_message = next(m for m in state["history"] if m["role"] == "tool")
    assert tool_message["content"].startswith("Error:")
    sent = scripted.requests[1].json["messages"]
    assert sent[-1]["role"] == "tool" and sent[-1]["content"].startswith("Error:")


def test_when_only_one_call_fits_the_last_call_is_made_without_tools(store, queue, scripted):
    slow = chat_reply(None, [tool_call("calculator", {"expression": "6*7"})])
    scripted.add(delayed(2.6, slow))  # leaves ~1.4 s: one 1 s call, not two
    scripted.add(chat_reply("42, answered with what I had"))
    cid = ask(store, queue, "6*7?", scripted_config(scripted, min_call_s=1.0))
    state = wait_done(store, cid)
    assert state["status"] == "done"
    last_request = scripted.requests[1].json
    assert "tools" not in last_request or not last_request["tools"]
    assert "tool_choice" not in last_request and scripted.requests[0].json["tool_choice"] == "auto"
    assert "Answer now" in last_request["messages"][-1]["content"]
    assert steps_of(state, "model")[-1]["last_call"] is True


def test_tool_calls_that_repeat_an_id_run_once_and_every_call_sent_back_has_one_result_of_its_own(
        store, queue, scripted):
    """A regression: two calls with one id both ran, and their two results shared the id, a history
    providers refuse. A repeat within one reply is refused; a later reply's call under an id used
    earlier in the turn runs, under a fresh id."""
    scripted.add(chat_reply(None, [tool_call("calculator", {"expression": "2+2"}, "call_1"),
                                   tool_call("calculator", {"expression": "3*3"}, "call_1")]))
    scripted.add(chat_reply(None, [tool_call("calculator", {"expression": "5+5"}, "call_1")]))
    scripted.add(chat_reply("done"))
    cid = ask(store, queue, "hi", scripted_config(scripted))
    state = wait_done(store, cid)
    assert state["status"] == "done"
    ran = [s for s in steps_of(state, "tool") if s["outcome"] == "ok"]
    assert [(s["call_id"], s["result"]) for s in ran] == [("call_1", "4"), ("call_1_3", "10")]
    for request in scripted.requests[1:]:
        messages = request.json["messages"]
        call_ids = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        result_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert len(set(call_ids)) == len(call_ids), call_ids
        assert sorted(result_ids) == sorted(call_ids), "exactly one result per call"
    results = {m["tool_call_id"]: m["content"] for m in state["history"] if m["role"] == "tool"}
    assert results == {"call_1": "4", "call_1_2": results["call_1_2"], "call_1_3": "10"}
    assert "repeated the id 'call_1'" in results["call_1_2"]


def test_job_timeout_exception_is_never_swallowed(store, queue, redis_client):
    # Safeguards off: no deadline, so the queue's own timeout fires inside the call.
    cid = ask(store, queue, "hi", FAST.with_changes(model="demo:hang", job_timeout_s=3, safeguards=False))
    state = wait_done(store, cid, timeout_s=15)
    # The failure callback writes the ending before RQ records the job's status: wait for that.
    assert wait_job_ended(redis_client, state["job_id"]) == "failed"  # swallowed, it would be "finished"
    assert state["status"] == "timed_out"
    assert state["error"]["kind"] == "job_timeout"  # written by the on_failure callback
    # The job wrote nothing itself, yet the ending knows when it ran: RQ's start and timeout.
    assert state["job_timeout_at"] == pytest.approx(state["started_at"] + 3, abs=0.01)
    assert state["turns"][-1]["started_at"] == state["started_at"]


def test_a_message_to_a_conversation_with_a_turn_in_flight_is_refused(store, queue):
    cid = ask(store, queue, "slow 1", FAST)
    with pytest.raises(TurnInFlight):
        submit_turn(store, queue, cid, "and another", FAST)
    state = wait_done(store, cid)
    assert [m["content"] for m in state["history"] if m["role"] == "user"] == ["slow 1"]
    # After the turn has ended, the next message starts a new turn.
    submit_turn(store, queue, cid, "What is 2+2?", FAST)
    state = wait_done(store, cid)
    assert [m["content"] for m in state["history"] if m["role"] == "user"] == ["slow 1", "What is 2+2?"]


def test_the_same_turn_submitted_twice_runs_once(store, queue):
    cid = "dup-" + str(time.time_ns())
    submit_turn(store, queue, cid, "What is 3*3?", FAST, turn_id="t" + cid)
    submit_turn(store, queue, cid, "What is 3*3?", FAST, turn_id="t" + cid)
    # And the job itself enqueued again (a re-run) finds the turn claimed.
    queue.enqueue("agent.turn.run_turn", cid, "t" + cid, job_id=job_id_for("t" + cid) + "-again")
    state = wait_done(store, cid)
    time.sleep(0.5)
    state = store.read(cid)
    assert sum(1 for m in state["history"] if m["role"] == "user") == 1
    assert sum(1 for m in state["history"] if m["role"] == "assistant" and m.get("content")) == 1


def test_the_api_key_appears_in_nothing_stored_in_redis(store, queue, scripted, redis_client):
    scripted.add(chat_reply(None, [tool_call("calculator", {"expression": "5*5"})]), chat_reply("25"))
    cid = ask(store, queue, "5*5?", scripted_config(scripted))
    wait_done(store, cid)
    assert scripted.requests[0].headers["authorization"] == f"Bearer {CANARY_KEY}"  # the key was used
    assert CANARY_KEY.encode() not in redis_dump(redis_client)


def test_a_job_naming_another_function_is_refused_and_the_worker_survives(store, queue, redis_client, tmp_path):
    marker = tmp_path / "pwned"
    forged = queue.enqueue("os.system", f"touch {marker}", job_id="forged-" + str(time.time_ns()))
    wait_for(lambda: forged.get_status(refresh=True).value in ("failed", "finished"), 30, "a worker takes the job")
    assert forged.get_status().value == "failed"
    assert not marker.exists()
    cid = ask(store, queue, "What is 1+1?")
    assert wait_done(store, cid)["status"] == "done"


def test_a_slow_tool_is_bounded_by_the_remaining_budget_and_the_turn_still_answers(store, queue):
    """A regression: the tool got every second left before the deadline, so the promised last call
    without tools was skipped (0.2 s left). Its limit now keeps that call's minimum free."""
    from agent.deadline import TOOL_CUT_SLACK_S

    # Its answer written all at once (~0): the last call has the minimum, 0.5 s, not time to stream it.
    cid = ask(store, queue, "hi", FAST.with_changes(model="demo:slow-tool~0"))
    state = wait_done(store, cid, timeout_s=15)
    wait_step = next(s for s in steps_of(state, "tool") if s["name"] == "wait")
    assert "stopped at the tool's time limit" in wait_step["result"]
    kept_s = FAST.min_call_s + TOOL_CUT_SLACK_S
    assert wait_step["kept_s"] == pytest.approx(kept_s)
    assert wait_step["timeout_s"] == pytest.approx(wait_step["remaining_s"] - kept_s, abs=0.01)
    assert state["status"] == "done", [(s["kind"], s["outcome"], s.get("detail")) for s in state["steps"]]
    last = steps_of(state, "model")[-1]
    assert last["outcome"] == "ok" and last["last_call"], "the last call, without tools, answered"
    assert not steps_of(state, "skip")
    assert state["history"][-1]["role"] == "assistant" and "Waited" in state["history"][-1]["content"]
    assert state["updated_at"] < state["deadline_at"]


def test_the_flaky_scenario_is_retried_to_success_inside_the_budget(store, queue):
    cid = ask(store, queue, "hello", FAST.with_changes(model="demo:flaky~0", job_timeout_s=12))
    state = wait_done(store, cid, timeout_s=20)
    assert state["status"] == "done"
    outcomes = [(s["kind"], s["outcome"]) for s in state["steps"]]
    assert outcomes[:4] == [("model", "error"), ("retry", "ok"), ("model", "error"), ("retry", "ok")]
    assert outcomes[4] == ("model", "ok")


def test_a_job_carries_only_ids_as_json_never_the_message_or_a_key(store, queue, redis_client):
    message = "What is 12*12? secret-message-text"
    cid = ask(store, queue, message)
    job_id = store.read_meta(cid)["job_id"]
    raw = redis_client.hgetall(f"rq:job:{job_id}")
    job = SafeJob.fetch(job_id, connection=redis_client, serializer=JSONSerializer)
    assert job.func_name == "agent.turn.run_turn"
    assert list(job.args) == [cid, store.read_meta(cid)["turn_id"]] and job.kwargs == {}
    data = zlib.decompress(raw[b"data"])  # RQ compresses the payload
    assert json.loads(data)[0] == "agent.turn.run_turn"  # RQ's JSON serializer, not pickle
    everything = b"".join(raw.values()) + data
    assert b"secret-message-text" not in everything
    assert CANARY_KEY.encode() not in everything
    wait_done(store, cid)


def test_a_retried_submit_whose_first_try_never_reached_the_queue_still_runs_its_turn(store, queue):
    # The state landed, then Redis failed before (or while) the job was enqueued; the client retries
    # with the same turn id, as the CLI does after a transient error.
    class LostEnqueue:
        connection = queue.connection

        def enqueue(self, *args, **kwargs):
            raise ConnectionError("the connection dropped while enqueueing")

    cid, turn_id = "retried-submit", "turn-retried"
    with pytest.raises(ConnectionError):
        submit_turn(store, LostEnqueue(), cid, "What is 6*7?", FAST, turn_id=turn_id)
    submit_turn(store, queue, cid, "What is 6*7?", FAST, turn_id=turn_id)
    state = wait_done(store, cid)
    assert state["status"] == "done", state["error"]
    assert "42" in state["history"][-1]["content"]
    assert [m["role"] for m in state["history"]].count("user") == 1

    # A double submit of a turn that was enqueued still runs it once.
    submit_turn(store, queue, cid, "What is 6*7?", FAST, turn_id=turn_id)
    assert wait_done(store, cid)["version"] == state["version"]
